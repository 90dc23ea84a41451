// agora rl {problems, corpus, eval, train, sapo}: RL post-training on tasks with verifiable
// rewards (docs/rl.md). serve, work and sapo-node, its network roles, are in cmd_rl_net.cc.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/obs/progress.h"
#include "agora/rl/arithmetic.h"
#include "agora/rl/grpo_trainer.h"
#include "agora/rl/held_out.h"
#include "agora/rl/sampling.h"
#include "agora/rl/sapo.h"
#include "agora/train/device.h"
#include "commands.h"

namespace agora::cli {

void add_task_options(CLI::App* cmd, std::string& task, TaskOptions& options) {
  cmd->add_option("--task", task,
                  "arithmetic, arithmetic-worked (answers worked column by column) or countdown")
      ->capture_default_str();
  cmd->add_option("--task-seed", options.seed, "The seed problems are generated from")
      ->capture_default_str();
  cmd->add_option("--held-out", options.held_out_fraction,
                  "Fraction of problems held out for evaluation (by prompt hash)")
      ->capture_default_str();
  cmd->add_option("--max-digits", options.max_digits, "arithmetic: digits per operand, at most")
      ->capture_default_str();
  cmd->add_option("--numbers", options.numbers, "countdown: numbers given per problem")
      ->capture_default_str();
}

namespace {

void add_problems(CLI::App& parent) {
  struct Args {
    std::string task = "arithmetic";
    TaskOptions options;
    int64_t count = 5;
    bool held_out = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand("problems", "Print a task's problems and their solutions");
  add_task_options(cmd, args->task, args->options);
  cmd->add_option("--count", args->count, "How many")->capture_default_str();
  cmd->add_flag("--held-out-split", args->held_out, "From the held-out split");
  cmd->callback([args] {
    const auto task = make_task(args->task, args->options);
    uint64_t id = 0;
    for (int64_t i = 0; i < args->count; ++i) {
      const Problem p = task->next(id, args->held_out);
      fmt::print("{:>8}  {}{}\n", p.id, p.prompt, p.solution);
    }
  });
}

void add_corpus(CLI::App& parent) {
  struct Args {
    std::string task = "arithmetic", out;
    TaskOptions options;
    int64_t problems = 200'000;
    double careless = 0;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand(
      "corpus",
      "Write training problems with their solutions, one per line (a base model's corpus)");
  add_task_options(cmd, args->task, args->options);
  cmd->add_option("--problems", args->problems, "How many lines")->capture_default_str();
  cmd->add_option("--careless", args->careless,
                  "arithmetic-worked: the share of lines worked without carrying or borrowing "
                  "(wrong whenever a column carries)")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "The text file to write")->required();
  cmd->callback([args] {
    if (args->problems < 1) fail("--problems {} is invalid (allowed: >= 1)", args->problems);
    if (args->careless != 0 && args->task != "arithmetic-worked") {
      fail("--careless applies to --task arithmetic-worked only (got --task {})", args->task);
    }
    const auto task = make_task(args->task, args->options);
    const auto* arithmetic = dynamic_cast<const ArithmeticTask*>(task.get());
    std::string text;
    uint64_t id = 0;
    for (int64_t i = 0; i < args->problems; ++i) {
      const Problem p = task->next(id, /*want_held_out=*/false);
      text += p.prompt;
      text += arithmetic ? arithmetic->corpus_solution(p, args->careless) : p.solution;
      text += '\n';
    }
    const std::filesystem::path out(args->out);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    write_file_atomic(out, text);
    fmt::print("wrote {} {} problems ({}) -> {}\n", args->problems, args->task,
               format_bytes(static_cast<double>(text.size())), args->out);
  });
}

void add_eval(CLI::App& parent) {
  struct Args {
    std::string checkpoint, task = "arithmetic", device = "auto";
    TaskOptions options;
    int64_t problems = 200, max_new_tokens = 24, show = 5;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand("eval", "Held-out accuracy of a checkpoint on a task (greedy)");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint folder")->required();
  add_task_options(cmd, args->task, args->options);
  cmd->add_option("--problems", args->problems, "Held-out problems to answer")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "Tokens per answer, at most")
      ->capture_default_str();
  cmd->add_option("--show", args->show, "Print this many answers")->capture_default_str();
  cmd->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  cmd->callback([args] {
    if (args->problems < 1) fail("--problems {} is invalid (allowed: >= 1)", args->problems);
    LoadedCheckpoint checkpoint = load_checkpoint(args->checkpoint, resolve_device(args->device));
    if (checkpoint.tokenizer_spec.empty())
      fail("checkpoint {} names no tokenizer", args->checkpoint);
    const auto tokenizer = load_tokenizer(checkpoint.tokenizer_spec);
    const auto task = make_task(args->task, args->options);
    uint64_t id = 0;
    CompletionSampling greedy;
    greedy.count = 1;
    greedy.temperature = 0;
    greedy.max_new_tokens = args->max_new_tokens;
    for (int64_t i = 0; i < std::min(args->show, args->problems); ++i) {
      const Problem p = task->next(id, /*want_held_out=*/true);
      const Completion c = sample_completions(checkpoint.model, tokenizer->eot_id(),
                                              tokenizer->encode(p.prompt), greedy)
                               .front();
      const std::string answer = completion_text(*tokenizer, c.tokens);
      fmt::print("{}{}  {}\n", p.prompt, answer, task->reward(p, answer) > 0.5 ? "right" : "wrong");
    }
    const HeldOutScore score =
        score_held_out(checkpoint.model, *tokenizer, *task, args->problems, args->max_new_tokens);
    fmt::print("{} held-out {} problems: {} right, accuracy {:.3f}\n", score.problems, args->task,
               score.correct, score.accuracy());
  });
}

void add_train(CLI::App& parent) {
  struct Args {
    std::string checkpoint, device = "auto", out = "runs/rl", task = "arithmetic";
    std::vector<std::string> workers;
    TaskOptions task_options;
    GrpoTrainOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand(
      "train", "Improve a checkpoint with GRPO on a task's verifiable rewards (one process)");
  auto& o = args->options;
  cmd->add_option("--checkpoint", args->checkpoint, "The base model's checkpoint folder")
      ->required();
  add_task_options(cmd, args->task, args->task_options);
  cmd->add_option("--steps", o.steps, "Updates")->capture_default_str();
  cmd->add_option("--prompts", o.prompts_per_step, "Prompts per update")->capture_default_str();
  cmd->add_option("--group", o.group_size, "Completions per prompt (G)")->capture_default_str();
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens per completion, at most")
      ->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--grad-clip", o.grad_clip, "Gradient norm clip (0: none)")
      ->capture_default_str();
  cmd->add_option("--eps-low", o.grpo.eps_low, "Clip range below 1")->capture_default_str();
  cmd->add_option("--eps-high", o.grpo.eps_high, "Clip range above 1")->capture_default_str();
  cmd->add_option("--ratio-cap", o.grpo.ratio_cap,
                  "Cap on the ratio for negative advantages (0: off)")
      ->capture_default_str();
  cmd->add_option("--policy-lag", o.policy_lag,
                  "Sample rollouts with the policy this many updates old (asynchronous RL)")
      ->capture_default_str();
  cmd->add_option("--eval-interval", o.eval_interval, "Held-out evaluation every N updates")
      ->capture_default_str();
  cmd->add_option("--eval-problems", o.eval_problems, "Held-out problems per evaluation")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--workers", args->workers,
                  "Rollouts from simulated workers through the learner's checks, e.g. "
                  "honest,honest,other-model (also fabricate, replay, stale, teacher-force)")
      ->delimiter(',');
  cmd->add_option("--max-off-policy", o.max_off_policy_steps,
                  "Refuse worker rollouts more than this many versions old")
      ->capture_default_str();
  cmd->add_option("--rescore-tolerance", o.rescore_tolerance,
                  "Largest |claimed - recomputed| log-probability accepted")
      ->capture_default_str();
  cmd->add_option("--draw-tolerance", o.draw_tolerance,
                  "Largest distance of a seeded draw from its token's interval")
      ->capture_default_str();
  cmd->add_option("--strikes", o.strikes_to_ban, "Strikes that ban a worker")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Folder for rl.jsonl and the checkpoint 'latest'")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  cmd->callback([args] {
    GrpoTrainOptions options = args->options;
    options.out_dir = args->out;
    for (const std::string& w : args->workers) options.workers.push_back(parse_worker_behaviour(w));
    validate(options);
    const auto task = make_task(args->task, args->task_options);
    LoadedCheckpoint base = load_checkpoint(args->checkpoint, resolve_device(args->device));
    const GrpoTrainSummary s = train_grpo(std::move(base), *task, options);
    fmt::print(
        "held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points) after {} updates, {} rollouts "
        "in {} ({:.1f} rollouts/s)\n",
        s.base_accuracy, s.final_accuracy, 100 * (s.final_accuracy - s.base_accuracy), s.steps,
        s.rollouts, format_duration(s.seconds),
        s.seconds > 0 ? static_cast<double>(s.rollouts) / s.seconds : 0.0);
    if (!s.verdicts.empty()) {
      std::string verdicts, strikes;
      for (const auto& [name, n] : s.verdicts) {
        if (n > 0) verdicts += fmt::format(" {} {}", name, n);
      }
      for (const auto& [name, n] : s.strikes) strikes += fmt::format(" {} {}", name, n);
      fmt::print("rollouts:{}\nstrikes:{}\n", verdicts, strikes);
    }
    fmt::print("checkpoint {}\n", s.checkpoint.string());
  });
}

void add_sapo(CLI::App& parent) {
  struct Args {
    std::string checkpoint, device = "auto", out = "runs/sapo", task = "arithmetic";
    TaskOptions task_options;
    SapoOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand(
      "sapo", "A swarm of nodes with their own policies sharing rollouts as text (SAPO)");
  auto& o = args->options;
  cmd->add_option("--checkpoint", args->checkpoint, "The base model every node starts from")
      ->required();
  add_task_options(cmd, args->task, args->task_options);
  cmd->add_option("--nodes", o.nodes, "Nodes")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Rounds (one update per node each)")->capture_default_str();
  cmd->add_option("--own", o.own, "I: a node's own groups per round")->capture_default_str();
  cmd->add_option("--shared", o.shared, "J: groups taken from the other nodes per round")
      ->capture_default_str();
  cmd->add_option("--group", o.group_size, "Completions per problem (G)")->capture_default_str();
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens per completion, at most")
      ->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--eval-problems", o.eval_problems, "Held-out problems at the start and end")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--out", args->out, "Folder for sapo.jsonl")->capture_default_str();
  cmd->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  cmd->callback([args] {
    validate(args->options);
    const auto task = make_task(args->task, args->task_options);
    const LoadedCheckpoint base = load_checkpoint(args->checkpoint, resolve_device(args->device));
    std::filesystem::create_directories(args->out);
    std::ofstream rows(std::filesystem::path(args->out) / "sapo.jsonl", std::ios::trunc);
    fmt::print("{:>6}  {:>11}  {:>10}  {:>8}\n", "round", "mean reward", "cumulative", "elapsed");
    const SapoSummary s = run_sapo(base, *task, args->options, [&](const SapoRound& r) {
      rows << nlohmann::json{{"event", "sapo_round"},
                             {"round", r.round},
                             {"reward", r.reward},
                             {"mean_reward", r.mean_reward},
                             {"cumulative_reward", r.cumulative_reward},
                             {"elapsed_s", r.seconds}}
                  .dump()
           << "\n"
           << std::flush;
      if (r.round % 5 == 0 || r.round == 1) {
        fmt::print("{:>6}  {:>11.3f}  {:>10.2f}  {:>8}\n", r.round, r.mean_reward,
                   r.cumulative_reward, format_duration(r.seconds));
        std::fflush(stdout);
      }
    });
    rows << nlohmann::json{{"event", "sapo_summary"},
                           {"cumulative_reward", s.cumulative_reward},
                           {"base_accuracy", s.base_accuracy},
                           {"accuracy", s.accuracy},
                           {"mean_accuracy", s.mean_accuracy},
                           {"elapsed_s", s.seconds}}
                .dump()
         << "\n";
    fmt::print(
        "{} nodes, {} own + {} shared groups per round: cumulative reward {:.2f}; held-out "
        "accuracy {:.3f} -> {:.3f} (mean of nodes) in {}\n",
        args->options.nodes, args->options.own, args->options.shared, s.cumulative_reward,
        s.base_accuracy, s.mean_accuracy, format_duration(s.seconds));
  });
}

}  // namespace

void add_rl_command(CLI::App& app) {
  auto* rl = app.add_subcommand("rl", "RL post-training on tasks with verifiable rewards");
  rl->require_subcommand(1);
  add_problems(*rl);
  add_corpus(*rl);
  add_eval(*rl);
  add_train(*rl);
  add_sapo(*rl);
  add_rl_serve(*rl);
  add_rl_work(*rl);
  add_rl_sapo_node(*rl);
}

}  // namespace agora::cli
