#include "agora/rl/grpo_trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "agora/core/error.h"
#include "agora/obs/event_log.h"
#include "agora/obs/progress.h"
#include "agora/rl/group_batch.h"
#include "agora/rl/held_out.h"
#include "agora/rl/policy_versions.h"
#include "agora/rl/rescore.h"
#include "agora/rl/rl_progress.h"
#include "agora/rl/rollout_intake.h"
#include "agora/rl/sampling.h"
#include "agora/rl/seeded_draw.h"
#include "agora/rl/worker_sim.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// The workers' submissions for `problems`, through the intake (rollout_intake.h) and re-scoring
// under the version each claims (rescore.h); what survives forms the groups.
void collect_from_workers(GroupBatch& batch, SimulatedWorkers& workers, RolloutIntake& intake,
                          PolicyVersions& versions, const Task& task, const Tokenizer& tokenizer,
                          const std::vector<Problem>& problems, uint64_t sampled_with,
                          uint64_t seed, const GrpoTrainOptions& options) {
  intake.set_version(versions.newest());
  for (const Problem& p : problems) intake.open(p.id);
  SimulatedWorkers::Request request;
  request.task = &task;
  request.tokenizer = &tokenizer;
  request.policy = &versions.model(sampled_with);
  request.policy_version = sampled_with;
  request.current_version = versions.newest();
  request.problems = problems;
  request.group_size = options.group_size;
  request.max_new_tokens = options.max_new_tokens;
  request.temperature = options.temperature;
  request.seed = seed;
  const std::vector<Submission> submissions = workers.produce(request);
  batch.submitted += static_cast<int64_t>(submissions.size());

  struct Admitted {
    std::string worker;
    Rollout rollout;
  };
  std::vector<Admitted> admitted;
  for (const Submission& s : submissions) {
    RolloutIntake::Result r = intake.submit(s.worker, s.bytes);
    if (r.verdict == IntakeVerdict::kAccepted) {
      admitted.push_back({s.worker, std::move(*r.rollout)});
    } else {
      ++batch.refused;
    }
  }
  std::map<uint64_t, const Problem*> by_id;
  std::map<uint64_t, std::vector<TokenId>> prompt_of;
  for (const Problem& p : problems) {
    by_id[p.id] = &p;
    prompt_of[p.id] = tokenizer.encode(p.prompt);
  }
  // Re-score, one forward pass per claimed version.
  std::map<uint64_t, std::vector<size_t>> by_version;
  for (size_t i = 0; i < admitted.size(); ++i) {
    by_version[admitted[i].rollout.policy_version].push_back(i);
  }
  std::vector<bool> consistent(admitted.size(), false);
  for (const auto& [version, members] : by_version) {
    std::vector<std::vector<TokenId>> prompts;
    std::vector<const Rollout*> rollouts;
    std::vector<uint64_t> seeds;
    for (size_t i : members) {
      const Rollout& r = admitted[i].rollout;
      prompts.push_back(prompt_of.at(r.problem_id));
      rollouts.push_back(&r);
      seeds.push_back(slot_seed(kLocalRunId, r.problem_id, r.sample));
    }
    std::vector<double> draw_gaps;
    const std::vector<double> gaps =
        rescore_gaps(versions.model(version), tokenizer.eot_id(), prompts, rollouts,
                     options.temperature, &seeds, &draw_gaps);
    for (size_t k = 0; k < members.size(); ++k) {
      consistent[members[k]] =
          gaps[k] <= options.rescore_tolerance && draw_gaps[k] <= options.draw_tolerance;
      if (!consistent[members[k]]) {
        intake.strike(admitted[members[k]].worker, IntakeVerdict::kMismatch);
        ++batch.refused;
      }
    }
  }
  // Groups in problem order, samples in (worker, sample) order: the same submissions give the
  // same batch whatever order they arrived in.
  std::map<uint64_t, std::vector<const Admitted*>> groups;
  for (size_t i = 0; i < admitted.size(); ++i) {
    if (consistent[i]) groups[admitted[i].rollout.problem_id].push_back(&admitted[i]);
  }
  for (const Problem& p : problems) {
    intake.close(p.id);
    auto& members = groups[p.id];
    std::sort(members.begin(), members.end(), [](const Admitted* a, const Admitted* b) {
      return std::tie(a->worker, a->rollout.sample) < std::tie(b->worker, b->rollout.sample);
    });
    std::vector<Sample> samples;
    for (const Admitted* a : members) {
      samples.push_back(
          {{a->rollout.tokens.begin(), a->rollout.tokens.end()}, a->rollout.logprobs});
    }
    add_group(batch, task, tokenizer, *by_id.at(p.id), prompt_of.at(p.id), std::move(samples),
              options.grpo);
  }
}

// The sampling seed of prompt `j` of step `step`: distinct per (run seed, step, prompt).
uint64_t sample_seed(uint64_t seed, int64_t step, int64_t j) {
  return seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^
         static_cast<uint64_t>(j);
}

}  // namespace

void validate(const GrpoTrainOptions& o) {
  if (o.steps < 0) fail("rl steps {} is invalid (allowed: >= 0)", o.steps);
  if (o.prompts_per_step < 1) {
    fail("rl prompts per step {} is invalid (allowed: >= 1)", o.prompts_per_step);
  }
  if (o.group_size < 2) {
    fail("rl group size {} is invalid (allowed: >= 2; GRPO compares completions within a group)",
         o.group_size);
  }
  if (o.max_new_tokens < 1)
    fail("rl max new tokens {} is invalid (allowed: >= 1)", o.max_new_tokens);
  if (!(o.temperature > 0)) {
    fail("rl temperature {} is invalid (allowed: > 0; sampling needs spread)", o.temperature);
  }
  if (!(o.lr > 0)) fail("rl lr {} is invalid (allowed: > 0)", o.lr);
  if (o.grad_clip < 0) fail("rl grad clip {} is invalid (allowed: >= 0; 0 = none)", o.grad_clip);
  if (o.grpo.eps_low < 0 || o.grpo.eps_low >= 1 || o.grpo.eps_high < 0) {
    fail("rl clip range [1 - {}, 1 + {}] is invalid (allowed: 0 <= eps_low < 1, eps_high >= 0)",
         o.grpo.eps_low, o.grpo.eps_high);
  }
  if (o.grpo.ratio_cap != 0 && o.grpo.ratio_cap <= 1 + o.grpo.eps_high) {
    fail("rl ratio cap {} is invalid (allowed: 0 = off, or above 1 + eps_high = {})",
         o.grpo.ratio_cap, 1 + o.grpo.eps_high);
  }
  if (o.policy_lag < 0) fail("rl policy lag {} is invalid (allowed: >= 0)", o.policy_lag);
  if (o.max_off_policy_steps < 0) {
    fail("rl max off-policy steps {} is invalid (allowed: >= 0)", o.max_off_policy_steps);
  }
  if (!o.workers.empty() && o.policy_lag > o.max_off_policy_steps) {
    fail("rl policy lag {} exceeds max off-policy steps {}: every honest rollout would be refused",
         o.policy_lag, o.max_off_policy_steps);
  }
  if (!(o.draw_tolerance > 0 && o.draw_tolerance < 1)) {
    fail("rl draw tolerance {} is invalid (allowed: 0 < tolerance < 1)", o.draw_tolerance);
  }
  if (!(o.rescore_tolerance > 0)) {
    fail("rl rescore tolerance {} is invalid (allowed: > 0)", o.rescore_tolerance);
  }
  if (o.strikes_to_ban < 1)
    fail("rl strikes to ban {} is invalid (allowed: >= 1)", o.strikes_to_ban);
  if (o.eval_interval < 0) fail("rl eval interval {} is invalid (allowed: >= 0)", o.eval_interval);
  if (o.eval_problems < 1) fail("rl eval problems {} is invalid (allowed: >= 1)", o.eval_problems);
}

GrpoTrainSummary train_grpo(LoadedCheckpoint base, const Task& task,
                            const GrpoTrainOptions& options,
                            const std::function<void(const GrpoStepStats&)>& on_step) {
  validate(options);
  if (base.tokenizer_spec.empty()) fail("the base checkpoint names no tokenizer");
  const auto tokenizer = load_tokenizer(base.tokenizer_spec);
  const auto eot = static_cast<TokenId>(base.meta.eot_id);
  Llama& model = base.model;
  model->train();

  fs::create_directories(options.out_dir);
  const auto started = Clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - started).count();
  };
  obs::EventLog events(options.out_dir / "rl.jsonl", /*append=*/false, elapsed);

  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(0.0));

  // The policies rollouts may come from, and that re-scoring may need: the newest (the live
  // model) and up to max(policy lag, max off-policy steps) behind it.
  const bool with_workers = !options.workers.empty();
  PolicyVersions versions(
      model,
      std::max<int64_t>(options.policy_lag, with_workers ? options.max_off_policy_steps : 0));
  std::optional<SimulatedWorkers> workers;
  std::optional<RolloutIntake> intake;
  if (with_workers) {
    workers.emplace(options.workers, model);
    IntakeOptions io;
    io.task = task.name();
    io.task_seed = task.seed();
    io.max_off_policy_steps = static_cast<uint64_t>(options.max_off_policy_steps);
    io.group_size = static_cast<uint32_t>(options.group_size);
    io.limits.max_tokens = static_cast<uint32_t>(options.max_new_tokens);
    io.limits.vocab_size = static_cast<uint32_t>(model->config().vocab_size);
    io.limits.min_logprob = kMinRolloutLogprob;
    io.strikes_to_ban = options.strikes_to_ban;
    intake.emplace(io);
  }

  const auto held_out = [&] {
    return score_held_out(model, *tokenizer, task, options.eval_problems, options.max_new_tokens)
        .accuracy();
  };

  GrpoTrainSummary summary;
  summary.base_accuracy = held_out();
  double last_held_out = summary.base_accuracy;
  {
    GrpoStepStats s;
    s.held_out = summary.base_accuracy;
    s.seconds = elapsed();
    events.write(rl_step_json(s));
  }
  if (options.table) {
    print_rl_table_header();
    GrpoStepStats s;
    s.seconds = elapsed();
    print_rl_table_row(s, summary.base_accuracy, options.steps);
  }

  uint64_t cursor = 0;
  int64_t rollouts = 0;
  for (int64_t step = 1; step <= options.steps; ++step) {
    const uint64_t version = versions.newest();
    const uint64_t sampled_with = version - std::min<uint64_t>(version, options.policy_lag);
    std::vector<Problem> problems;
    for (int64_t j = 0; j < options.prompts_per_step; ++j) {
      problems.push_back(task.next(cursor, /*want_held_out=*/false));
    }
    GroupBatch batch;
    if (!workers) {
      Llama& policy = versions.model(sampled_with);
      for (int64_t j = 0; j < options.prompts_per_step; ++j) {
        const Problem& problem = problems[static_cast<size_t>(j)];
        const std::vector<TokenId> prompt = tokenizer->encode(problem.prompt);
        CompletionSampling sampling;
        sampling.count = options.group_size;
        sampling.max_new_tokens = options.max_new_tokens;
        sampling.temperature = options.temperature;
        sampling.seed = sample_seed(options.seed, step, j);
        std::vector<Completion> group = sample_completions(policy, eot, prompt, sampling);
        batch.submitted += static_cast<int64_t>(group.size());
        std::vector<Sample> samples;
        for (Completion& c : group) samples.push_back({std::move(c.tokens), std::move(c.logprobs)});
        add_group(batch, task, *tokenizer, problem, prompt, std::move(samples), options.grpo);
      }
    } else {
      collect_from_workers(batch, *workers, *intake, versions, task, *tokenizer, problems,
                           sampled_with, sample_seed(options.seed, step, 0), options);
    }
    rollouts += batch.submitted;
    const GrpoLoss loss = grpo_update(model, optimizer, eot, batch, options.temperature,
                                      options.grad_clip, options.grpo);
    versions.advance();

    GrpoStepStats s = step_stats(step, batch, loss, options.prompts_per_step, rollouts);
    const bool evaluate =
        step == options.steps || (options.eval_interval > 0 && step % options.eval_interval == 0);
    if (evaluate) s.held_out = last_held_out = held_out();
    s.seconds = elapsed();
    events.write(rl_step_json(s));
    if (on_step) on_step(s);
    if (options.table && (evaluate || step == 1 || step % 5 == 0)) {
      print_rl_table_row(s, last_held_out, options.steps);
    }
  }
  summary.final_accuracy = last_held_out;
  summary.steps = options.steps;
  summary.rollouts = rollouts;
  summary.seconds = elapsed();
  if (intake) {
    for (int v = 0; v < kIntakeVerdicts; ++v) {
      const auto verdict = static_cast<IntakeVerdict>(v);
      summary.verdicts[std::string(verdict_name(verdict))] = intake->count(verdict);
    }
    for (size_t w = 0; w < workers->size(); ++w) {
      summary.strikes[workers->name(w)] = intake->strikes(workers->name(w));
    }
    nlohmann::json row = {
        {"event", "rl_intake"}, {"verdicts", summary.verdicts}, {"strikes", summary.strikes}};
    events.write(row);
  }

  CheckpointMeta meta = base.meta;
  meta.step = base.meta.step + options.steps;
  meta.val_loss = NAN;
  summary.checkpoint = options.out_dir / "latest";
  save_checkpoint(summary.checkpoint, model, meta, base.tokenizer_spec, base.run_config_toml,
                  std::nullopt);
  return summary;
}

}  // namespace agora
