#include "agora/rl/sapo.h"

#include <chrono>
#include <memory>

#include "agora/core/error.h"
#include "agora/rl/group_batch.h"
#include "agora/rl/held_out.h"
#include "agora/rl/sampling.h"
#include "agora/rl/sapo_draw.h"

namespace agora {
namespace {

// What a node publishes: one group, as text.
struct SharedGroup {
  int64_t node = 0;
  Problem problem;
  std::vector<TokenId> prompt;
  std::vector<std::vector<TokenId>> completions;
  bool informative = false;
};

}  // namespace

void validate(const SapoOptions& o) {
  if (o.nodes < 2)
    fail("sapo nodes {} is invalid (allowed: >= 2; one node has no one to share with)", o.nodes);
  if (o.rounds < 1) fail("sapo rounds {} is invalid (allowed: >= 1)", o.rounds);
  if (o.own < 1) fail("sapo own groups {} is invalid (allowed: >= 1)", o.own);
  if (o.shared < 0) fail("sapo shared groups {} is invalid (allowed: >= 0)", o.shared);
  if (o.group_size < 2) fail("sapo group size {} is invalid (allowed: >= 2)", o.group_size);
  if (o.max_new_tokens < 1)
    fail("sapo max new tokens {} is invalid (allowed: >= 1)", o.max_new_tokens);
  if (!(o.temperature > 0)) fail("sapo temperature {} is invalid (allowed: > 0)", o.temperature);
  if (!(o.lr > 0)) fail("sapo lr {} is invalid (allowed: > 0)", o.lr);
  if (o.eval_problems < 1)
    fail("sapo eval problems {} is invalid (allowed: >= 1)", o.eval_problems);
}

SapoSummary run_sapo(const LoadedCheckpoint& base, const Task& task, const SapoOptions& o,
                     const std::function<void(const SapoRound&)>& on_round) {
  validate(o);
  if (base.tokenizer_spec.empty()) fail("the base checkpoint names no tokenizer");
  const auto tokenizer = load_tokenizer(base.tokenizer_spec);
  const auto eot = static_cast<TokenId>(base.meta.eot_id);
  const torch::Device device = base.model->parameters().front().device();

  // Every node starts from the base model, with its own optimizer.
  std::vector<Llama> models;
  std::vector<std::unique_ptr<torch::optim::AdamW>> optimizers;
  for (int64_t n = 0; n < o.nodes; ++n) {
    Llama m(base.model->config());
    m->to(device);
    torch::NoGradGuard no_grad;
    const auto source = base.model->named_parameters();
    for (auto& p : m->named_parameters()) p.value().copy_(source[p.key()]);
    models.push_back(m);
    optimizers.push_back(std::make_unique<torch::optim::AdamW>(
        m->parameters(), torch::optim::AdamWOptions(o.lr).betas({0.9, 0.99}).weight_decay(0.0)));
  }

  const auto started = std::chrono::steady_clock::now();
  SapoSummary summary;
  summary.base_accuracy =
      score_held_out(models[0], *tokenizer, task, o.eval_problems, o.max_new_tokens).accuracy();
  uint64_t cursor = 0;  // the problems are dealt to the nodes in turn: each sees its own
  double cumulative = 0;
  for (int64_t round = 1; round <= o.rounds; ++round) {
    // Each node samples and publishes its own groups.
    std::vector<SharedGroup> published;
    SapoRound row;
    row.round = round;
    for (int64_t n = 0; n < o.nodes; ++n) {
      double sum = 0;
      for (int64_t j = 0; j < o.own; ++j) {
        SharedGroup g;
        g.node = n;
        g.problem = task.next(cursor, /*want_held_out=*/false);
        g.prompt = tokenizer->encode(g.problem.prompt);
        CompletionSampling sampling;
        sampling.count = o.group_size;
        sampling.max_new_tokens = o.max_new_tokens;
        sampling.temperature = o.temperature;
        sampling.seed =
            sapo_mix(o.seed ^ sapo_mix(static_cast<uint64_t>(round) << 24 ^
                                       static_cast<uint64_t>(n) << 12 ^ static_cast<uint64_t>(j)));
        std::vector<double> rewards;
        for (Completion& c :
             sample_completions(models[static_cast<size_t>(n)], eot, g.prompt, sampling)) {
          rewards.push_back(task.reward(g.problem, completion_text(*tokenizer, c.tokens)));
          g.completions.push_back(std::move(c.tokens));
        }
        for (double r : rewards) sum += r;
        g.informative = rewards_differ(rewards);
        published.push_back(std::move(g));
      }
      row.reward.push_back(sum / static_cast<double>(o.own * o.group_size));
    }
    // Each node trains on its own groups plus `shared` drawn from the others' informative ones.
    for (int64_t n = 0; n < o.nodes; ++n) {
      std::vector<const SharedGroup*> chosen, theirs;
      std::vector<bool> informative;
      for (const SharedGroup& g : published) {
        if (g.node == n) {
          chosen.push_back(&g);
        } else {
          theirs.push_back(&g);
          informative.push_back(g.informative);
        }
      }
      const uint64_t state =
          sapo_mix(o.seed ^ 0x5A90 ^ static_cast<uint64_t>(round) << 16 ^ static_cast<uint64_t>(n));
      for (size_t i : draw_shared(informative, o.shared, state)) chosen.push_back(theirs[i]);
      GroupBatch batch;
      for (const SharedGroup* g : chosen) {
        std::vector<Sample> samples;
        for (const auto& c : g->completions) samples.push_back({c, {}});
        add_group(batch, task, *tokenizer, g->problem, g->prompt, std::move(samples), o.grpo);
      }
      grpo_update(models[static_cast<size_t>(n)], *optimizers[static_cast<size_t>(n)], eot, batch,
                  o.temperature, o.grad_clip, o.grpo);
    }
    for (double r : row.reward) row.mean_reward += r / static_cast<double>(o.nodes);
    cumulative += row.mean_reward;
    row.cumulative_reward = cumulative;
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (on_round) on_round(row);
  }
  summary.cumulative_reward = cumulative;
  for (auto& m : models) {
    summary.accuracy.push_back(
        score_held_out(m, *tokenizer, task, o.eval_problems, o.max_new_tokens).accuracy());
    summary.mean_accuracy += summary.accuracy.back() / static_cast<double>(o.nodes);
  }
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

}  // namespace agora
