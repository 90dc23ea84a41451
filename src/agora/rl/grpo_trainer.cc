#include "agora/rl/grpo_trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <algorithm>
#include <deque>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/obs/progress.h"
#include "agora/rl/held_out.h"
#include "agora/rl/sampling.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
using Parameters = std::map<std::string, torch::Tensor>;

Parameters snapshot(Llama& model) {
  torch::NoGradGuard no_grad;
  Parameters out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// The sampling seed of prompt `j` of step `step`: distinct per (run seed, step, prompt).
uint64_t sample_seed(uint64_t seed, int64_t step, int64_t j) {
  return seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^
         static_cast<uint64_t>(j);
}

nlohmann::json step_json(const GrpoStepStats& s) {
  nlohmann::json row = {{"event", "rl_step"},
                        {"step", s.step},
                        {"reward", s.reward},
                        {"informative_groups", s.informative},
                        {"loss", s.loss},
                        {"clipped_fraction", s.clipped_fraction},
                        {"capped_fraction", s.capped_fraction},
                        {"mean_ratio", s.mean_ratio},
                        {"completion_tokens", s.completion_tokens},
                        {"rollouts", s.rollouts},
                        {"elapsed_s", s.seconds}};
  if (s.held_out >= 0) row["held_out_accuracy"] = s.held_out;
  return row;
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
  if (o.max_new_tokens < 1) fail("rl max new tokens {} is invalid (allowed: >= 1)", o.max_new_tokens);
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
  std::ofstream events(options.out_dir / "rl.jsonl", std::ios::trunc);
  if (!events) fail("cannot write {}", (options.out_dir / "rl.jsonl").string());

  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(0.0));

  // The policies rollouts may come from: version v is the model after v updates; the front is
  // the one `policy_lag` updates behind the newest (or the base while fewer updates were made).
  std::deque<Parameters> versions;
  Llama lagged{nullptr};
  if (options.policy_lag > 0) {
    versions.push_back(snapshot(model));
    lagged = Llama(model->config());
    lagged->to(model->parameters().front().device());
  }

  const auto started = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
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
    events << step_json(s).dump() << "\n" << std::flush;
  }
  if (options.table) {
    fmt::print("{:>6}  {:>6}  {:>11}  {:>8}  {:>10}  {:>7}  {:>8}  {:>8}\n", "step", "reward",
               "informative", "held-out", "rollouts/s", "clipped", "elapsed", "ETA");
    fmt::print("{:>6}  {:>6}  {:>11}  {:>8.3f}  {:>10}  {:>7}  {:>8}  {:>8}\n", 0, "-", "-",
               summary.base_accuracy, "-", "-", format_duration(elapsed()), "-");
  }

  uint64_t cursor = 0;
  int64_t rollouts = 0;
  for (int64_t step = 1; step <= options.steps; ++step) {
    Llama* policy = &model;
    if (options.policy_lag > 0) {
      copy_parameters(lagged, versions.front(), "the lagged rollout policy");
      policy = &lagged;
    }
    std::vector<std::vector<TokenId>> prompts, completions;
    std::vector<std::vector<float>> old_logprobs;
    std::vector<float> advantages;
    double reward_sum = 0, tokens = 0;
    int64_t informative = 0;
    for (int64_t j = 0; j < options.prompts_per_step; ++j) {
      const Problem problem = task.next(cursor, /*want_held_out=*/false);
      const std::vector<TokenId> prompt = tokenizer->encode(problem.prompt);
      CompletionSampling sampling;
      sampling.count = options.group_size;
      sampling.max_new_tokens = options.max_new_tokens;
      sampling.temperature = options.temperature;
      sampling.seed = sample_seed(options.seed, step, j);
      std::vector<Completion> group = sample_completions(*policy, eot, prompt, sampling);
      std::vector<double> rewards;
      for (const Completion& c : group) {
        rewards.push_back(task.reward(problem, completion_text(*tokenizer, c.tokens)));
        reward_sum += rewards.back();
        tokens += static_cast<double>(c.tokens.size());
      }
      if (std::any_of(rewards.begin(), rewards.end(), [&](double r) { return r != rewards[0]; })) {
        ++informative;
      }
      const std::vector<double> a = group_advantages(rewards, options.grpo);
      for (size_t i = 0; i < group.size(); ++i) {
        prompts.push_back(prompt);
        completions.push_back(std::move(group[i].tokens));
        old_logprobs.push_back(std::move(group[i].logprobs));
        advantages.push_back(static_cast<float>(a[i]));
      }
    }
    const auto rows = static_cast<int64_t>(completions.size());
    rollouts += rows;

    const ScoredBatch scored =
        completion_logprobs(model, eot, prompts, completions, options.temperature);
    const torch::Tensor old =
        completion_layout(prompts, old_logprobs, scored.logp.size(1)).to(scored.logp.device());
    const GrpoLoss loss =
        grpo_loss(scored.logp, old, torch::tensor(advantages).to(scored.logp.device()),
                  scored.mask, options.grpo);
    optimizer.zero_grad();
    loss.loss.backward();
    if (options.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), options.grad_clip);
    optimizer.step();
    if (options.policy_lag > 0) {
      versions.push_back(snapshot(model));
      while (static_cast<int64_t>(versions.size()) > options.policy_lag + 1) versions.pop_front();
    }

    GrpoStepStats s;
    s.step = step;
    s.reward = reward_sum / static_cast<double>(rows);
    s.informative = static_cast<double>(informative) / static_cast<double>(options.prompts_per_step);
    s.loss = loss.loss.item<double>();
    s.clipped_fraction = loss.clipped_fraction;
    s.capped_fraction = loss.capped_fraction;
    s.mean_ratio = loss.mean_ratio;
    s.completion_tokens = tokens / static_cast<double>(rows);
    s.rollouts = rollouts;
    const bool evaluate = step == options.steps ||
                          (options.eval_interval > 0 && step % options.eval_interval == 0);
    if (evaluate) s.held_out = last_held_out = held_out();
    s.seconds = elapsed();
    events << step_json(s).dump() << "\n" << std::flush;
    if (on_step) on_step(s);
    if (options.table && (evaluate || step == 1 || step % 5 == 0)) {
      const double eta = s.seconds / static_cast<double>(step) *
                         static_cast<double>(options.steps - step);
      fmt::print("{:>6}  {:>6.3f}  {:>11.2f}  {:>8.3f}  {:>10.1f}  {:>7.3f}  {:>8}  {:>8}\n", step,
                 s.reward, s.informative, last_held_out, static_cast<double>(rollouts) / s.seconds,
                 s.clipped_fraction, format_duration(s.seconds), format_duration(eta));
      std::fflush(stdout);
    }
  }
  summary.final_accuracy = last_held_out;
  summary.steps = options.steps;
  summary.rollouts = rollouts;
  summary.seconds = elapsed();

  CheckpointMeta meta = base.meta;
  meta.step = base.meta.step + options.steps;
  meta.val_loss = NAN;
  summary.checkpoint = options.out_dir / "latest";
  save_checkpoint(summary.checkpoint, model, meta, base.tokenizer_spec, base.run_config_toml,
                  std::nullopt);
  return summary;
}

}  // namespace agora
