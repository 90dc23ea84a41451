// agora rl serve / agora rl work: the learner and the rollout workers of an RL run as separate
// processes over the network (docs/rl.md section 7); agora rl sapo-node: one node of a SAPO swarm
// across machines (docs/rl.md section 5).
#include <fmt/format.h>

#include <filesystem>

#include "agora/core/error.h"
#include "agora/net/identity.h"
#include "agora/obs/progress.h"
#include "agora/rl/learner_server.h"
#include "agora/rl/rollout_worker.h"
#include "agora/rl/sapo_node.h"
#include "agora/train/device.h"
#include "admission_options.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {

void add_rl_serve(CLI::App& rl) {
  struct Args {
    std::string checkpoint, key, http = "off", out = "runs/rl-net";
    LearnerOptions options;
    AdmissionOptions admission;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = rl.add_subcommand(
      "serve", "Be the learner of an RL run: hand out problems, check rollouts, train with GRPO");
  auto& o = args->options;
  auto& t = o.train;
  cmd->add_option("--checkpoint", args->checkpoint, "The base model's checkpoint folder")
      ->required();
  cmd->add_option("--key", args->key, "The learner's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--listen", o.listen, "Where workers connect (tcp://HOST:PORT)")
      ->capture_default_str();
  add_admission_options(*cmd, args->admission, "workers");
  cmd->add_option("--http", args->http,
                  "Serve the status page, /api/rl and /metrics on HOST:PORT (off = none)")
      ->capture_default_str();
  cmd->add_option("--run-id", o.run_id, "The run's name, in every signature")
      ->capture_default_str();
  add_task_options(cmd, o.task_name, o.task);
  cmd->add_option("--steps", t.steps, "Updates")->capture_default_str();
  cmd->add_option("--prompts", t.prompts_per_step, "Prompts per update")->capture_default_str();
  cmd->add_option("--group", t.group_size, "Completions per prompt (G)")->capture_default_str();
  cmd->add_option("--max-new-tokens", t.max_new_tokens, "Tokens per completion, at most")
      ->capture_default_str();
  cmd->add_option("--temperature", t.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--lr", t.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--eval-interval", t.eval_interval, "Held-out evaluation every N updates")
      ->capture_default_str();
  cmd->add_option("--eval-problems", t.eval_problems, "Held-out problems per evaluation")
      ->capture_default_str();
  cmd->add_option("--max-off-policy", t.max_off_policy_steps,
                  "Refuse rollouts more than this many versions old")
      ->capture_default_str();
  cmd->add_option("--rescore-rate", o.rescore_rate, "Share of rollouts re-scored, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--rescore-tolerance", t.rescore_tolerance,
                  "Largest |claimed - recomputed| log-probability accepted")
      ->capture_default_str();
  cmd->add_option("--draw-tolerance", t.draw_tolerance,
                  "Largest distance of a seeded draw from its token's interval")
      ->capture_default_str();
  cmd->add_option("--strikes", t.strikes_to_ban, "Strikes that ban a worker")
      ->capture_default_str();
  cmd->add_option("--reassign-after", o.reassign_seconds,
                  "Seconds before an unanswered slot is handed to another worker")
      ->capture_default_str();
  cmd->add_option("--step-timeout", o.step_timeout_seconds,
                  "Train on the complete groups after this many seconds (0: wait for all)")
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every,
                  "Updates between saves a restart resumes from (0: at the end only)")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Folder for rl.jsonl and the checkpoint 'latest'")
      ->capture_default_str();
  cmd->callback([args] {
    LearnerOptions options = args->options;
    options.train.out_dir = args->out;
    if (args->http != "off") options.http = obs::parse_http_address(args->http, "--http");
    options.admission = admission_of(args->admission);
    options.stop = &stop_requested();
    validate(options);
    const net::Identity identity = net::Identity::load(args->key);
    LoadedCheckpoint base = load_checkpoint(args->checkpoint, torch::kCPU);
    const GrpoTrainSummary s = serve_learner(std::move(base), identity, options);
    fmt::print(
        "held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points) after {} updates, {} "
        "rollouts in {}\n",
        s.base_accuracy, s.final_accuracy, 100 * (s.final_accuracy - s.base_accuracy), s.steps,
        s.rollouts, format_duration(s.seconds));
    std::string verdicts;
    for (const auto& [name, n] : s.verdicts) {
      if (n > 0) verdicts += fmt::format(" {} {}", name, n);
    }
    fmt::print("rollouts:{}\ncheckpoint {}\n", verdicts, s.checkpoint.string());
  });
}

void add_rl_work(CLI::App& rl) {
  struct Args {
    std::string key, learner_key, base, behaviour = "honest", log;
    RolloutWorkerOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = rl.add_subcommand(
      "work", "Be a rollout worker: fetch the policy, answer problems, submit signed rollouts");
  auto& o = args->options;
  cmd->add_option("--key", args->key, "This worker's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--learner", o.learner, "The learner's address (tcp://HOST:PORT)")->required();
  cmd->add_option("--learner-key", args->learner_key, "The learner's public key (hex)")->required();
  cmd->add_option("--base", args->base, "The base checkpoint the run starts from")->required();
  cmd->add_option("--slots", o.slots_per_request, "Slots asked for at once")->capture_default_str();
  cmd->add_option("--idle-timeout", o.idle_timeout_seconds,
                  "Give up after this many seconds without an answer")
      ->capture_default_str();
  cmd->add_option("--behave", args->behaviour,
                  "honest, or a cheat the learner must catch: other-model, fabricate, replay, "
                  "stale, teacher-force")
      ->capture_default_str();
  cmd->add_option("--log", args->log, "Write JSON lines of what happened here");
  cmd->callback([args] {
    RolloutWorkerOptions options = args->options;
    options.learner_key = net::key_from_hex(args->learner_key, "--learner-key");
    options.base = args->base;
    options.behaviour = parse_worker_behaviour(args->behaviour);
    options.log = args->log;
    const net::Identity identity = net::Identity::load(args->key);
    const RolloutWorkerSummary s = run_rollout_worker(identity, options);
    std::string receipts;
    for (const auto& [verdict, n] : s.receipts) receipts += fmt::format(" {} {}", verdict, n);
    fmt::print("{} rollouts submitted in {}, policy version {}; receipts:{}{}\n", s.submitted,
               format_duration(s.seconds), s.version, receipts,
               s.refused.empty() ? "" : "\nrefused by the learner: " + s.refused);
    if (!s.refused.empty()) throw Error("the learner banned this worker: " + s.refused);
  });
}

void add_rl_sapo_node(CLI::App& rl) {
  struct Args {
    std::string checkpoint, key, out = "runs/sapo-node";
    std::vector<std::string> peers;
    SapoNodeOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = rl.add_subcommand(
      "sapo-node", "Be one node of a SAPO swarm across machines: share sampled groups as text");
  auto& o = args->options;
  cmd->add_option("--checkpoint", args->checkpoint, "The base model (every node starts from it)")
      ->required();
  cmd->add_option("--key", args->key, "This node's identity (agora keygen --out FILE)")->required();
  cmd->add_option("--listen", o.listen, "Where the other nodes connect (tcp://HOST:PORT)")
      ->capture_default_str();
  cmd->add_option("--peer", args->peers,
                  "Another node, tcp://HOST:PORT@PUBLIC_KEY_HEX (repeat for each)")
      ->required();
  add_task_options(cmd, o.task_name, o.task);  // the same on every node
  cmd->add_option("--rounds", o.sapo.rounds, "Rounds (one update each)")->capture_default_str();
  cmd->add_option("--own", o.sapo.own, "I: own groups per round")->capture_default_str();
  cmd->add_option("--shared", o.sapo.shared, "J: groups taken from the other nodes per round")
      ->capture_default_str();
  cmd->add_option("--group", o.sapo.group_size, "Completions per problem (G)")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", o.sapo.max_new_tokens, "Tokens per completion, at most")
      ->capture_default_str();
  cmd->add_option("--temperature", o.sapo.temperature, "Sampling temperature")
      ->capture_default_str();
  cmd->add_option("--lr", o.sapo.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--eval-problems", o.sapo.eval_problems, "Held-out problems at start and end")
      ->capture_default_str();
  cmd->add_option("--seed", o.sapo.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--share-wait", o.share_wait_seconds,
                  "Seconds a round waits for the other nodes' groups")
      ->capture_default_str();
  cmd->add_option("--linger", o.linger_seconds, "Seconds answering peers after the last round")
      ->capture_default_str();
  cmd->add_option("--behave", o.behaviour,
                  "honest, or what the peers must refuse or cap: garbage, held-out, flood")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Folder for sapo.jsonl")->capture_default_str();
  cmd->callback([args] {
    SapoNodeOptions options = args->options;
    options.out = args->out;
    for (const std::string& p : args->peers) options.peers.push_back(parse_sapo_peer(p));
    options.stop = &stop_requested();
    validate(options);
    const net::Identity identity = net::Identity::load(args->key);
    LoadedCheckpoint base = load_checkpoint(args->checkpoint, torch::kCPU);
    const SapoNodeSummary s = run_sapo_node(std::move(base), identity, options);
    std::string refused;
    for (const auto& [why, n] : s.refused) refused += fmt::format(" {} {}", why, n);
    fmt::print(
        "{} rounds, {} own + {} shared groups: cumulative reward {:.2f}; held-out "
        "accuracy {:.3f} -> {:.3f}; {} groups received, {} used; refused:{} in {}\n",
        s.rounds, options.sapo.own, options.sapo.shared, s.cumulative_reward, s.base_accuracy,
        s.accuracy, s.shared_received, s.shared_used, refused.empty() ? " none" : refused,
        format_duration(s.seconds));
  });
}

}  // namespace agora::cli
