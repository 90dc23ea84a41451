#include "agora/rl/worker_sim.h"

#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/rl/rollout.h"
#include "agora/rl/sampling.h"
#include "agora/rl/seeded_draw.h"

namespace agora {

WorkerBehaviour parse_worker_behaviour(std::string_view name) {
  if (name == "honest") return WorkerBehaviour::kHonest;
  if (name == "other-model") return WorkerBehaviour::kOtherModel;
  if (name == "fabricate") return WorkerBehaviour::kFabricate;
  if (name == "replay") return WorkerBehaviour::kReplay;
  if (name == "stale") return WorkerBehaviour::kStale;
  if (name == "teacher-force") return WorkerBehaviour::kTeacherForce;
  fail(
      "unknown rl worker behaviour '{}' (allowed: honest, other-model, fabricate, replay, stale, "
      "teacher-force)",
      name);
}

std::string_view behaviour_name(WorkerBehaviour behaviour) {
  switch (behaviour) {
    case WorkerBehaviour::kHonest:
      return "honest";
    case WorkerBehaviour::kOtherModel:
      return "other-model";
    case WorkerBehaviour::kFabricate:
      return "fabricate";
    case WorkerBehaviour::kReplay:
      return "replay";
    case WorkerBehaviour::kStale:
      return "stale";
    case WorkerBehaviour::kTeacherForce:
      return "teacher-force";
  }
  return "?";
}

SimulatedWorkers::SimulatedWorkers(std::vector<WorkerBehaviour> behaviours, Llama& base)
    : behaviours_(std::move(behaviours)), last_(behaviours_.size()) {
  if (behaviours_.empty()) fail("rl simulated workers: none given");
  frozen_ = Llama(base->config());
  frozen_->to(base->parameters().front().device());
  torch::NoGradGuard no_grad;
  const auto source = base->named_parameters();
  for (auto& p : frozen_->named_parameters()) p.value().copy_(source[p.key()]);
  frozen_->eval();
}

std::string SimulatedWorkers::name(size_t worker) const {
  return fmt::format("worker-{}-{}", worker, behaviour_name(behaviours_[worker]));
}

std::vector<Submission> SimulatedWorkers::produce(const Request& q) {
  std::vector<Submission> out;
  const auto workers = static_cast<int64_t>(behaviours_.size());
  const TokenId eot = q.tokenizer->eot_id();
  for (int64_t w = 0; w < workers; ++w) {
    const WorkerBehaviour b = behaviours_[static_cast<size_t>(w)];
    std::vector<std::string> sent;
    for (size_t j = 0; j < q.problems.size(); ++j) {
      const Problem& problem = q.problems[j];
      std::vector<uint32_t> samples;  // this worker's share of the group
      for (int64_t i = w; i < q.group_size; i += workers)
        samples.push_back(static_cast<uint32_t>(i));
      if (samples.empty()) continue;
      Rollout r;
      r.task = q.task->name();
      r.task_seed = q.task->seed();
      r.problem_id = problem.id;
      if (b == WorkerBehaviour::kFabricate || b == WorkerBehaviour::kTeacherForce) {
        const std::vector<TokenId> answer = q.tokenizer->encode(problem.solution);
        r.tokens.assign(answer.begin(), answer.end());
        r.tokens.push_back(eot);
        r.logprobs =
            b == WorkerBehaviour::kFabricate
                ? std::vector<float>(r.tokens.size(), -0.01f)
                : teacher_forced_logprobs(*q.policy, eot, q.tokenizer->encode(problem.prompt),
                                          r.tokens, q.temperature);
        r.policy_version = b == WorkerBehaviour::kFabricate ? q.current_version : q.policy_version;
        for (uint32_t i : samples) {
          r.sample = i;
          sent.push_back(encode_rollout(r));
        }
        continue;
      }
      const bool own_model = b == WorkerBehaviour::kOtherModel || b == WorkerBehaviour::kStale;
      CompletionSampling sampling;
      sampling.count = static_cast<int64_t>(samples.size());
      sampling.max_new_tokens = q.max_new_tokens;
      sampling.temperature = q.temperature;
      for (uint32_t i : samples)
        sampling.row_seeds.push_back(slot_seed(kLocalRunId, problem.id, i));
      const std::vector<Completion> group = sample_completions(
          own_model ? frozen_ : *q.policy, eot, q.tokenizer->encode(problem.prompt), sampling);
      r.policy_version = b == WorkerBehaviour::kStale        ? 0
                         : b == WorkerBehaviour::kOtherModel ? q.current_version
                                                             : q.policy_version;
      for (size_t k = 0; k < group.size(); ++k) {
        r.sample = samples[k];
        r.tokens.assign(group[k].tokens.begin(), group[k].tokens.end());
        r.logprobs = group[k].logprobs;
        sent.push_back(encode_rollout(r));
      }
    }
    for (const std::string& bytes : sent) out.push_back({name(static_cast<size_t>(w)), bytes});
    if (b == WorkerBehaviour::kReplay) {
      for (const std::string& bytes : sent) out.push_back({name(static_cast<size_t>(w)), bytes});
      for (const std::string& bytes : last_[static_cast<size_t>(w)]) {
        out.push_back({name(static_cast<size_t>(w)), bytes});
      }
      last_[static_cast<size_t>(w)] = std::move(sent);
    }
  }
  return out;
}

}  // namespace agora
