// GRPO: advantages and the clipped loss against hand-computed values, sampling's recorded
// log-probabilities against a recomputation, and the learner end to end on a tiny model.
#include "agora/rl/grpo.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/rl/group_batch.h"
#include "agora/rl/grpo_trainer.h"
#include "agora/rl/rescore.h"
#include "agora/rl/sampling.h"
#include "agora/rl/seeded_draw.h"
#include "agora/rl/task.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

TEST(Grpo, AdvantagesAreNormalisedWithinTheGroup) {
  const std::vector<double> rewards{1, 0, 0, 1};
  const auto a = group_advantages(rewards, GrpoOptions{});
  // mean 0.5, std with Bessel's correction sqrt(1/3) = 0.57735: A = +-0.5 / 0.57735.
  ASSERT_EQ(a.size(), 4u);
  EXPECT_NEAR(a[0], 0.866025, 1e-5);
  EXPECT_NEAR(a[1], -0.866025, 1e-5);
  for (double x : group_advantages(std::vector<double>{1, 1, 1}, GrpoOptions{})) EXPECT_EQ(x, 0);
  for (double x : group_advantages(std::vector<double>{0.7}, GrpoOptions{})) EXPECT_EQ(x, 0);
  EXPECT_THROW(group_advantages(std::vector<double>{}, GrpoOptions{}), Error);
}

// Two completions of three token slots each, the last slot padding (masked, with a ratio that
// would dominate if it counted). Row 0 has A = +1 and ratios 1.5 (clipped to 1.28) and 1; row 1
// has A = -1 and ratios 5 (capped at 4) and 0.5 (clipped to 0.8).
struct Case {
  torch::Tensor logp = torch::log(torch::tensor({{1.5, 1.0, 100.0}, {5.0, 0.5, 100.0}}))
                           .to(torch::kFloat32)
                           .requires_grad_(true);
  torch::Tensor old = torch::zeros({2, 3});
  torch::Tensor advantages = torch::tensor({1.0f, -1.0f});
  torch::Tensor mask = torch::tensor({{1.0f, 1.0f, 0.0f}, {1.0f, 1.0f, 0.0f}});
};

TEST(Grpo, LossMatchesHandComputedValues) {
  Case c;
  const GrpoLoss loss = grpo_loss(c.logp, c.old, c.advantages, c.mask, GrpoOptions{});
  // terms: min(1.5, 1.28) = 1.28; 1; min(-4, -1.28) = -4; min(-0.5, -0.8) = -0.8.
  EXPECT_NEAR(loss.loss.item<double>(), -(1.28 + 1 - 4 - 0.8) / 4, 1e-6);
  EXPECT_NEAR(loss.clipped_fraction, 0.75, 1e-9);
  EXPECT_NEAR(loss.capped_fraction, 0.25, 1e-9);
  EXPECT_NEAR(loss.mean_ratio, 2.0, 1e-5);

  // Only the unclipped token carries a gradient: d(-ratio * A / 4) / d logp = -ratio / 4.
  loss.loss.backward();
  const torch::Tensor expected = torch::tensor({{0.0f, -0.25f, 0.0f}, {0.0f, 0.0f, 0.0f}});
  EXPECT_TRUE(torch::allclose(c.logp.grad(), expected, 1e-6, 1e-7)) << c.logp.grad();
}

TEST(Grpo, WithoutTheCapANegativeAdvantageGrowsWithTheRatio) {
  Case c;
  GrpoOptions options;
  options.ratio_cap = 0;
  const GrpoLoss loss = grpo_loss(c.logp, c.old, c.advantages, c.mask, options);
  EXPECT_NEAR(loss.loss.item<double>(), -(1.28 + 1 - 5 - 0.8) / 4, 1e-6);
  EXPECT_EQ(loss.capped_fraction, 0);
}

TEST(Grpo, BadShapesAndEmptyMasksAreErrors) {
  Case c;
  EXPECT_THROW(grpo_loss(c.logp, torch::zeros({2, 2}), c.advantages, c.mask, GrpoOptions{}), Error);
  EXPECT_THROW(grpo_loss(c.logp, c.old, torch::zeros({3}), c.mask, GrpoOptions{}), Error);
  EXPECT_THROW(grpo_loss(c.logp, c.old, c.advantages, torch::zeros({2, 3}), GrpoOptions{}), Error);
}

Llama tiny_model(int64_t vocab) {
  torch::manual_seed(3);
  Llama model(model_preset("tiny", vocab, 64));
  return model;
}

// Four completions of the prompt {5, 17, 33, 8} at temperature 0.7, end of text 2.
CompletionSampling four_completions(int64_t max_new_tokens, uint64_t seed) {
  CompletionSampling s;
  s.count = 4;
  s.max_new_tokens = max_new_tokens;
  s.temperature = 0.7;
  s.seed = seed;
  return s;
}

TEST(RlSampling, RecordedLogprobsAreWhatTheLearnerRecomputes) {
  Llama model = tiny_model(300);
  const std::vector<TokenId> prompt{5, 17, 33, 8};
  const CompletionSampling s = four_completions(12, 11);
  const auto group = sample_completions(model, 2, prompt, s);
  const auto again = sample_completions(model, 2, prompt, s);
  ASSERT_EQ(group.size(), 4u);
  std::vector<std::vector<TokenId>> prompts, completions;
  std::vector<std::vector<float>> recorded;
  for (size_t i = 0; i < group.size(); ++i) {
    EXPECT_EQ(group[i].tokens, again[i].tokens) << "the same seed must give the same samples";
    ASSERT_EQ(group[i].tokens.size(), group[i].logprobs.size());
    EXPECT_EQ(group[i].ended, group[i].tokens.back() == 2);
    prompts.push_back(prompt);
    completions.push_back(group[i].tokens);
    recorded.push_back(group[i].logprobs);
  }
  torch::NoGradGuard no_grad;
  const ScoredBatch scored = completion_logprobs(model, 2, prompts, completions, 0.7);
  const torch::Tensor old = completion_layout(prompts, recorded, scored.logp.size(1));
  const torch::Tensor diff = ((scored.logp - old) * scored.mask).abs().max();
  EXPECT_LT(diff.item<double>(), 1e-4);
  EXPECT_EQ(scored.mask.sum().item<int64_t>(),
            static_cast<int64_t>(group[0].tokens.size() + group[1].tokens.size() +
                                 group[2].tokens.size() + group[3].tokens.size()));
}

// SAPO's shared text (rl/group_batch.h): a row without recorded log-probabilities, another
// node's completion, is scored under the receiving model itself, so its ratio is exactly 1; a
// row with recorded ones uses them. (Treating a missing record as log-probabilities of 0 would
// give ratios of exp(logp), far below 1.)
TEST(GrpoUpdate, SharedRowsAreScoredUnderTheReceiversPolicyWithRatioOne) {
  Llama model = tiny_model(300);
  const std::vector<TokenId> prompt{5, 17, 33, 8};
  const auto group = sample_completions(model, 2, prompt, four_completions(10, 5));
  GroupBatch shared, recorded;
  for (size_t i = 0; i < group.size(); ++i) {
    for (GroupBatch* b : {&shared, &recorded}) {
      b->prompts.push_back(prompt);
      b->completions.push_back(group[i].tokens);
      b->advantages.push_back(i % 2 == 0 ? 1.0f : -1.0f);
    }
    shared.old_logprobs.push_back({});
    // Recorded as sampled, less log 2: each token's ratio is 2 (clipped in the loss, counted
    // in mean_ratio as it is).
    std::vector<float> halved = group[i].logprobs;
    for (float& l : halved) l -= std::log(2.0f);
    recorded.old_logprobs.push_back(halved);
  }
  torch::optim::SGD frozen(model->parameters(), torch::optim::SGDOptions(0.0));
  const GrpoLoss on_policy = grpo_update(model, frozen, 2, shared, 0.7, 0.0, GrpoOptions{});
  EXPECT_DOUBLE_EQ(on_policy.mean_ratio, 1.0);
  EXPECT_EQ(on_policy.clipped_fraction, 0.0);
  const GrpoLoss off_policy = grpo_update(model, frozen, 2, recorded, 0.7, 0.0, GrpoOptions{});
  EXPECT_NEAR(off_policy.mean_ratio, 2.0, 1e-3);
  EXPECT_GT(off_policy.clipped_fraction, 0.0);
}

// Seeded draws (rl/seeded_draw.h): an honest worker's tokens are the ones its slots' seeds draw,
// which the learner's re-scoring pass confirms; a slot gives the same tokens sampled alone or in
// a batch (so a reassigned slot is answered alike); and tokens chosen by the worker, scored
// honestly by teacher forcing, pass re-scoring but not the draw check.
TEST(RlSampling, SeededDrawsAreCheckedByTheLearner) {
  Llama model = tiny_model(300);
  const std::vector<TokenId> prompt{5, 17, 33, 8};
  CompletionSampling s;
  s.count = 4;
  s.max_new_tokens = 12;
  s.temperature = 1.0;
  for (uint32_t sample = 0; sample < 4; ++sample)
    s.row_seeds.push_back(slot_seed("run", 9, sample));
  const auto group = sample_completions(model, 2, prompt, s);
  CompletionSampling alone = s;
  alone.count = 1;
  alone.row_seeds = {s.row_seeds[2]};
  EXPECT_EQ(sample_completions(model, 2, prompt, alone)[0].tokens, group[2].tokens);

  std::vector<Rollout> rollouts;
  for (size_t i = 0; i < group.size(); ++i) {
    Rollout r;
    r.sample = static_cast<uint32_t>(i);
    r.tokens.assign(group[i].tokens.begin(), group[i].tokens.end());
    r.logprobs = group[i].logprobs;
    rollouts.push_back(r);
  }
  // A chosen answer with its true log-probabilities, in slot 3's place.
  Rollout chosen = rollouts[3];
  chosen.tokens = {40, 41, 42, 43, 2};
  chosen.logprobs = teacher_forced_logprobs(model, 2, prompt, {40, 41, 42, 43, 2}, 1.0);
  rollouts.push_back(chosen);
  std::vector<const Rollout*> pointers;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<uint64_t> seeds = s.row_seeds;
  seeds.push_back(s.row_seeds[3]);
  for (const Rollout& r : rollouts) {
    pointers.push_back(&r);
    prompts.push_back(prompt);
  }
  std::vector<double> draws;
  const std::vector<double> gaps = rescore_gaps(model, 2, prompts, pointers, 1.0, &seeds, &draws);
  ASSERT_EQ(draws.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LT(gaps[i], 1e-4) << i;
    EXPECT_LT(draws[i], 1e-6) << "slot " << i << "'s tokens are its seed's draws";
  }
  EXPECT_LT(gaps[4], 1e-4) << "teacher forcing gives the true log-probabilities";
  EXPECT_GT(draws[4], 1e-3) << "but not tokens the seed draws";
  // Another slot's seed does not draw slot 0's tokens.
  std::vector<uint64_t> swapped = {s.row_seeds[1]};
  std::vector<double> swapped_draws;
  rescore_gaps(model, 2, {prompt}, {pointers[0]}, 1.0, &swapped, &swapped_draws);
  EXPECT_GT(swapped_draws[0], 1e-3);
}

TEST(RlSampling, ContextsPastTheModelAreErrors) {
  Llama model = tiny_model(300);
  const std::vector<TokenId> prompt(60, 7);
  CompletionSampling s;
  s.max_new_tokens = 8;
  EXPECT_THROW(sample_completions(model, 2, prompt, s), Error);
}

// A task an untrained model solves about half the time, so groups carry a signal: a completion
// is right when its text has an even length.
class EvenLengthTask final : public Task {
 public:
  explicit EvenLengthTask(std::string name = "even length") : Task(1, 0.5), name_(name) {}
  std::string name() const override { return name_; }
  Problem make(uint64_t id) const override {
    Problem p;
    p.id = id;
    p.prompt = fmt::format("{}+{}=", id % 97, id % 89);
    p.solution = "12";
    return p;
  }
  double reward(const Problem&, std::string_view completion) const override {
    return completion.size() % 2 == 0 ? 1.0 : 0.0;
  }

 private:
  std::string name_;
};

// The learner end to end on an untrained model: it runs, writes one JSON row per step, changes
// the weights, saves a loadable checkpoint, and gives the same numbers twice.
TEST(GrpoTrainer, RunsDeterministicallyAndWritesItsRows) {
  const fs::path tokenizer = fs::path(AGORA_DATA_DIR) / "tokenizer" / "agora-8k.model";
  ASSERT_TRUE(fs::exists(tokenizer)) << tokenizer << " is missing: run 'make data'";
  const fs::path root = fs::temp_directory_path() / ("agora_grpo_test_" + std::to_string(getpid()));
  fs::remove_all(root);
  std::vector<double> losses[2];
  const EvenLengthTask task;
  for (int run = 0; run < 2; ++run) {
    LoadedCheckpoint base;
    base.model = tiny_model(8192);
    base.meta.eot_id = 2;
    base.tokenizer_spec = tokenizer.string();
    const torch::Tensor before = base.model->parameters().front().detach().clone();
    GrpoTrainOptions o;
    o.steps = 2;
    o.prompts_per_step = 2;
    o.group_size = 3;
    o.max_new_tokens = 6;
    o.eval_problems = 3;
    o.lr = 1e-2;
    o.table = false;
    o.policy_lag = run;  // the lagged path runs too; step 1 samples the base either way
    o.out_dir = root / std::to_string(run);
    Llama model = base.model;
    const GrpoTrainSummary s = train_grpo(
        std::move(base), task, o, [&](const GrpoStepStats& st) { losses[run].push_back(st.loss); });
    EXPECT_EQ(s.rollouts, 2 * 2 * 3);
    EXPECT_FALSE(torch::equal(before, model->parameters().front()))
        << "an update must move weights";
    std::ifstream rows(o.out_dir / "rl.jsonl");
    std::string line;
    int count = 0;
    while (std::getline(rows, line)) {
      const auto row = nlohmann::json::parse(line);
      EXPECT_EQ(row.at("event"), "rl_step");
      EXPECT_EQ(row.at("step"), count);
      ++count;
    }
    EXPECT_EQ(count, 3);  // the base evaluation, then one per step
    EXPECT_NO_THROW(load_checkpoint(s.checkpoint, torch::kCPU));
  }
  ASSERT_EQ(losses[0].size(), 2u);
  EXPECT_EQ(losses[0][0], losses[1][0]);  // lag or not, the first step samples the base
  fs::remove_all(root);
}

// Rollouts from workers go through the intake and re-scoring: cheaters are caught, struck and
// banned, honest workers never are, and the run is repeatable. The task is the even-length one
// under the name "arithmetic" (so rollouts encode), which gives the policy a signal to move by:
// a worker that keeps the base model is only lying once the policy has moved.
TEST(GrpoTrainer, CheatingWorkersAreCaughtAndHonestOnesAreNot) {
  const fs::path tokenizer = fs::path(AGORA_DATA_DIR) / "tokenizer" / "agora-8k.model";
  ASSERT_TRUE(fs::exists(tokenizer)) << tokenizer << " is missing: run 'make data'";
  const fs::path root =
      fs::temp_directory_path() / ("agora_grpo_cheat_" + std::to_string(getpid()));
  fs::remove_all(root);
  const EvenLengthTask task("arithmetic");
  std::vector<double> losses[2];
  GrpoTrainSummary summaries[2];
  for (int run = 0; run < 2; ++run) {
    LoadedCheckpoint base;
    base.model = tiny_model(8192);
    base.meta.eot_id = 2;
    base.tokenizer_spec = tokenizer.string();
    GrpoTrainOptions o;
    o.steps = 4;
    o.prompts_per_step = 2;
    o.group_size = 8;
    o.max_new_tokens = 5;
    o.eval_problems = 2;
    o.eval_interval = 0;
    o.lr = 1e-2;
    o.table = false;
    o.max_off_policy_steps = 1;  // the stale worker's version 0 is refused from step 3 on
    o.strikes_to_ban = 2;
    for (const char* w :
         {"honest", "honest", "fabricate", "other-model", "replay", "stale", "teacher-force"}) {
      o.workers.push_back(parse_worker_behaviour(w));
    }
    o.out_dir = root / std::to_string(run);
    summaries[run] = train_grpo(std::move(base), task, o,
                                [&](const GrpoStepStats& s) { losses[run].push_back(s.loss); });
  }
  const GrpoTrainSummary& s = summaries[0];
  EXPECT_EQ(s.strikes.at("worker-0-honest"), 0);
  EXPECT_EQ(s.strikes.at("worker-1-honest"), 0);
  EXPECT_EQ(s.strikes.at("worker-5-stale"), 0)
      << "an old but truthful worker is refused, not struck";
  for (const char* cheat : {"worker-2-fabricate", "worker-3-other-model", "worker-4-replay",
                            "worker-6-teacher-force"}) {
    EXPECT_GE(s.strikes.at(cheat), 2) << cheat;
  }
  EXPECT_GT(s.verdicts.at("mismatch"), 0);   // fabricate, and other-model once the policy moved
  EXPECT_GT(s.verdicts.at("duplicate"), 0);  // replay
  EXPECT_GT(s.verdicts.at("stale"), 0);
  EXPECT_GT(s.verdicts.at("banned"), 0);
  EXPECT_EQ(s.verdicts.at("malformed"), 0);
  EXPECT_EQ(losses[0], losses[1]) << "the same submissions must give the same run";
  fs::remove_all(root);
}

TEST(GrpoTrainer, BadOptionsAreErrors) {
  GrpoTrainOptions o;
  o.group_size = 1;
  EXPECT_THROW(validate(o), Error);
  o = GrpoTrainOptions{};
  o.temperature = 0;
  EXPECT_THROW(validate(o), Error);
  o = GrpoTrainOptions{};
  o.grpo.ratio_cap = 1.1;
  EXPECT_THROW(validate(o), Error);
  o = GrpoTrainOptions{};
  o.policy_lag = -1;
  EXPECT_THROW(validate(o), Error);
  o = GrpoTrainOptions{};
  o.workers = {WorkerBehaviour::kHonest};
  o.policy_lag = 3;
  o.max_off_policy_steps = 2;  // every honest rollout would be stale
  EXPECT_THROW(validate(o), Error);
  EXPECT_THROW(parse_worker_behaviour("lazy"), Error);
}

}  // namespace
}  // namespace agora
