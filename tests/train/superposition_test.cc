// Token Superposition Training (docs/algorithms.md section 4): the bag layout, the multi-hot
// loss, equal FLOPs in both phases, a switch that leaves the weights and the optimizer state
// alone, s = 1 as ordinary training bit for bit, and validation of both losses in phase 1.
#include "agora/train/superposition.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/sampler.h"
#include "agora/train/batches.h"
#include "agora/train/checkpoint.h"
#include "agora/train/loss.h"
#include "agora/train/strategy_factory.h"
#include "agora/train/trainer.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

const std::string kData = AGORA_DATA_DIR "/tokens/sp8k";

ModelConfig tiny_model() {
  ModelConfig config = model_preset("tiny", 512, 16);
  config.validate();
  return config;
}

TEST(Superposition, BagAlignmentExample) {
  // docs/algorithms.md section 4: s = 2, tokens 10 11 12 13 14 15 -> inputs [10 11] [12 13],
  // targets [12 13] [14 15].
  const torch::Tensor windows = torch::tensor({10, 11, 12, 13, 14, 15}, torch::kInt64).view({1, 6});
  const Bags bags = split_bags(windows, 2);
  EXPECT_TRUE(
      torch::equal(bags.inputs, torch::tensor({10, 11, 12, 13}, torch::kInt64).view({1, 2, 2})));
  EXPECT_TRUE(
      torch::equal(bags.targets, torch::tensor({12, 13, 14, 15}, torch::kInt64).view({1, 2, 2})));
  // s = 1 is the ordinary shift by one token.
  const Bags ones = split_bags(windows, 1);
  EXPECT_TRUE(torch::equal(ones.inputs.squeeze(2), windows.narrow(1, 0, 5)));
  EXPECT_TRUE(torch::equal(ones.targets.squeeze(2), windows.narrow(1, 1, 5)));
  EXPECT_THROW(split_bags(windows, 4), Error);  // 6 tokens are not whole bags of 4
  EXPECT_THROW(split_bags(windows, 6), Error);  // one bag: nothing to predict
  EXPECT_THROW(split_bags(windows, 0), Error);
}

TEST(Superposition, BagEnteringTheModelIsTheMeanOfItsEmbeddings) {
  torch::manual_seed(3);
  Llama model(tiny_model());
  const torch::Tensor bags = torch::tensor({1, 2, 3, 4, 4, 4}, torch::kInt64).view({1, 2, 3});
  const torch::Tensor got = bag_embeddings(model, bags);
  const torch::Tensor table = model->model->embed_tokens->weight.detach();
  const torch::Tensor first = (table[1] + table[2] + table[3]) / 3, second = table[4];
  EXPECT_TRUE(torch::allclose(got[0][0], first, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(got[0][1], second, 1e-6, 1e-7));
  // s = 1: exactly the embedding.
  const torch::Tensor tokens = torch::tensor({5, 6, 7}, torch::kInt64).view({1, 3});
  EXPECT_TRUE(
      torch::equal(bag_embeddings(model, tokens.unsqueeze(2)), model->model->embed_tokens(tokens)));
}

TEST(Superposition, LossIsTheMeanOfSCrossEntropiesWithRepeatsCountedTwice) {
  torch::manual_seed(5);
  const int64_t V = 11, s = 4;
  const torch::Tensor logits = torch::randn({2, 3, V}, torch::kFloat32);
  // Row (0, 0) repeats token 5; row (1, 2) is one token four times.
  const torch::Tensor targets =
      torch::tensor({5, 5, 7, 9, 0, 1, 2, 3, 10, 10, 1, 2, 4, 4, 4, 6, 8, 9, 3, 2, 6, 6, 6, 6},
                    torch::kInt64)
          .view({2, 3, s});
  const double got = bag_loss(logits, targets).item<double>();

  // Independently, in double: the mean over positions and bag slots of -log softmax(target).
  const torch::Tensor lp = torch::log_softmax(logits.to(torch::kFloat64), -1);
  double total = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t k = 0; k < s; ++k)
        total -= lp[b][t][targets[b][t][k].item<int64_t>()].item<double>();
  EXPECT_NEAR(got, total / (2 * 3 * s), 1e-5);

  // The same as s ordinary cross-entropies of the same logits, averaged.
  double mean_ce = 0;
  for (int64_t k = 0; k < s; ++k) {
    mean_ce += next_token_loss(logits, targets.select(2, k)).item<double>() / s;
  }
  EXPECT_NEAR(got, mean_ce, 1e-6);

  // A repeated token counts twice: the bag {5, 5, 7, 9} is not the bag {5, 7, 9}.
  const torch::Tensor row = logits.narrow(0, 0, 1).narrow(1, 0, 1);
  const double repeated = bag_loss(row, torch::tensor({5, 5, 7, 9}).view({1, 1, 4})).item<double>();
  const double lp5 = lp[0][0][5].item<double>(), lp7 = lp[0][0][7].item<double>(),
               lp9 = lp[0][0][9].item<double>();
  EXPECT_NEAR(repeated, -(2 * lp5 + lp7 + lp9) / 4, 1e-5);
  EXPECT_GT(std::abs(repeated + (lp5 + lp7 + lp9) / 3), 1e-3);
}

TEST(Superposition, OneTokenBagsAreOrdinaryTrainingBitForBit) {
  torch::manual_seed(9);
  Llama a(tiny_model()), b(tiny_model());
  {
    torch::NoGradGuard no_grad;
    auto pb = b->parameters();
    auto pa = a->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  const torch::Tensor windows = torch::randint(0, 500, {4, 17}, torch::kInt64);
  const torch::Tensor ordinary =
      next_token_loss(a->forward(windows.narrow(1, 0, 16)), windows.narrow(1, 1, 16));
  const torch::Tensor bagged = superposition_loss(b, windows, 1);
  EXPECT_TRUE(torch::equal(ordinary, bagged))
      << ordinary.item<double>() << " vs " << bagged.item<double>();
  ordinary.backward();
  bagged.backward();
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].grad(), pb[i].grad())) << "gradient " << i;
  }
}

// Matrix-multiply FLOPs of one forward and backward, as libtorch's profiler counts them.
uint64_t matmul_flops(const std::function<torch::Tensor()>& loss) {
  uint64_t flops = 0;
  {
    torch::autograd::profiler::TLSLegacyProfilerGuard guard(
        torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU,
                                              /*report_input_shapes=*/true,
                                              /*profile_memory=*/false, /*with_stack=*/false,
                                              /*with_flops=*/true),
        [&](const torch::autograd::profiler::thread_event_lists& lists) {
          for (const auto& list : lists) {
            for (auto event : list) flops += event.flops();
          }
        });
    loss().backward();
  }
  return flops;
}

TEST(Superposition, FlopsPerStepAreEqualInBothPhases) {
  torch::manual_seed(4);
  Llama model(tiny_model());
  const int64_t B = 2, T = 16;
  for (const int64_t s : {2, 4, 8}) {
    SCOPED_TRACE(s);
    const torch::Tensor plain = torch::randint(0, 500, {B, T + 1}, torch::kInt64);
    const torch::Tensor bagged = torch::randint(0, 500, {B, s * (T + 1)}, torch::kInt64);
    const uint64_t ordinary = matmul_flops([&] {
      return next_token_loss(model->forward(plain.narrow(1, 0, T)), plain.narrow(1, 1, T));
    });
    const uint64_t superposed = matmul_flops([&] { return superposition_loss(model, bagged, s); });
    // The profiler counts matmuls (and a few elementwise ops); the model's FLOPs are there.
    const ModelConfig& c = model->config();
    const double lm_head = 2.0 * B * T * c.hidden_size * c.padded_vocab_size();
    ASSERT_GT(static_cast<double>(ordinary), lm_head) << "the profiler counted no model FLOPs";
    // Bag means and the loss's s gathers are the only extra work: well under 1%.
    EXPECT_NEAR(static_cast<double>(superposed) / static_cast<double>(ordinary), 1.0, 0.01)
        << ordinary << " vs " << superposed;
  }
}

class SuperpositionTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kData + "/meta.json")) << kData << " is missing: run 'make data'";
    dir_ = fs::temp_directory_path() / ("agora_tst_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunConfig config(const std::string& out, int64_t steps, const std::string& tst,
                   int64_t checkpoint_interval = 0, int64_t eval_interval = 0) {
    return RunConfig::parse(
        fmt::format(R"(
seed = 21
[model]
preset = "tiny"
[data]
dir = "{}"
seq_len = 32
[train]
steps = {}
batch_size = 8
micro_batch_size = 4
eval_interval = {}
eval_windows = 4
checkpoint_interval = {}
out_dir = "{}"
device = "cpu"
threads = 1
[schedule]
kind = "cosine"
warmup_steps = 1
[optimizer]
name = "adamw"
lr = 3e-3
[tst]
{}
)",
                    kData, steps, eval_interval, checkpoint_interval, (dir_ / out).string(), tst),
        "test");
  }
  static TrainOptions quiet(std::vector<StepStats>* steps = nullptr) {
    TrainOptions options;
    options.progress = false;
    if (steps) options.on_step = [steps](const StepStats& s) { steps->push_back(s); };
    return options;
  }

  fs::path dir_;
};

TEST_F(SuperpositionTrainerTest, OneTokenBagsTrainExactlyLikeOrdinaryTraining) {
  std::vector<StepStats> plain, bagged;
  const TrainSummary a = train(config("plain", 6, "bag = 1\nfraction = 0.0"), quiet(&plain));
  const TrainSummary b = train(config("bag1", 6, "bag = 1\nfraction = 0.5"), quiet(&bagged));
  EXPECT_EQ(b.tst_switch_step, 3);
  ASSERT_EQ(plain.size(), bagged.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].loss, bagged[i].loss) << i;
  EXPECT_EQ(a.parameter_hash, b.parameter_hash);
}

TEST_F(SuperpositionTrainerTest, PhasesSwitchAtTheConfiguredStep) {
  std::vector<StepStats> steps;
  const TrainSummary s = train(config("run", 10, "bag = 4\nfraction = 0.3"), quiet(&steps));
  EXPECT_EQ(s.tst_switch_step, 3);
  ASSERT_EQ(steps.size(), 10u);
  for (const StepStats& step : steps) EXPECT_EQ(step.bag, step.step < 3 ? 4 : 1) << step.step;
  // Checkpoints count the data tokens the run read: 3 steps of 8 x 32 x 4, 7 of 8 x 32.
  const LoadedCheckpoint checkpoint = load_checkpoint(s.checkpoint, torch::kCPU);
  EXPECT_EQ(checkpoint.meta.tokens_seen, 3u * 8 * 32 * 4 + 7u * 8 * 32);
}

// The switch is a plain step from where phase 1 left the weights and the optimizer state:
// recomputing the first phase-2 step by hand from the checkpoint before it gives the checkpoint
// after it, bit for bit.
TEST_F(SuperpositionTrainerTest, SwitchKeepsWeightsAndOptimizerState) {
  const RunConfig run = config("run", 4, "bag = 2\nfraction = 0.5", /*checkpoint_interval=*/1);
  ASSERT_EQ(run.tst_switch_step(), 2);
  train(run, quiet());
  const fs::path before = dir_ / "run" / "checkpoint_000002",
                 after = dir_ / "run" / "checkpoint_000003";

  LoadedCheckpoint loaded = load_checkpoint(before, torch::kCPU);
  Llama& model = loaded.model;
  model->train();
  const TrainingState state = load_training_state(before);
  ASSERT_FALSE(state.strategy.empty()) << "phase 1 left no optimizer state to carry";
  std::unique_ptr<Strategy> strategy = make_strategy(run, model);
  strategy->load_state(state.strategy);

  const int64_t step = 2, B = 8, b = 4, T = 32;
  const Sampler sampler = Sampler::from_directory(kData, "train", T, run.seed);
  const StepContext context{step, run.learning_rate(step), 1};
  strategy->before_forward(context);
  for (int64_t k = 0; k < B / b; ++k) {
    const torch::Tensor tokens = read_sequences(sampler, step * B + k * b, b);
    (next_token_loss(model->forward(tokens.narrow(1, 0, T)), tokens.narrow(1, 1, T)) / (B / b))
        .backward();
  }
  auto params = model->parameters();
  torch::nn::utils::clip_grad_norm_(params, run.optimizer.grad_clip);
  std::vector<Contribution> contributions = {strategy->contribute(context)};
  contributions[0].peer = "peer-000";
  strategy->apply(context, contributions);

  const LoadedCheckpoint expected = load_checkpoint(after, torch::kCPU);
  auto want = expected.model->named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  }
  const TrainingState expected_state = load_training_state(after);
  const auto got_state = strategy->state();
  ASSERT_EQ(got_state.size(), expected_state.strategy.size());
  for (const auto& [name, tensor] : got_state) {
    EXPECT_TRUE(torch::equal(tensor, expected_state.strategy.at(name))) << name;
  }
}

TEST_F(SuperpositionTrainerTest, ValidationReportsBothLossesInPhaseOne) {
  std::vector<EvalPoint> points;
  TrainOptions options = quiet();
  options.on_eval = [&](const EvalPoint& p) { points.push_back(p); };
  const TrainSummary s =
      train(config("run", 8, "bag = 2\nfraction = 0.5", 0, /*eval_interval=*/2), options);
  ASSERT_EQ(points.size(), 4u);  // after steps 2, 4, 6, 8
  double seconds_before = 0;
  for (const EvalPoint& p : points) {
    EXPECT_TRUE(std::isfinite(p.val_loss)) << p.step;
    // Steps 2 and 4 saw bags only (the switch is at 4): both losses. Later: next tokens only.
    EXPECT_EQ(std::isfinite(p.bag_val_loss), p.step <= 4) << p.step;
    // Training time so far: every two steps add to it (a wall-clock curve is drawn from it).
    EXPECT_GT(p.train_seconds, seconds_before) << p.step;
    seconds_before = p.train_seconds;
  }
  EXPECT_EQ(s.bag_val_history.size(), 2u);
  EXPECT_EQ(s.val_history.size(), 4u);
  EXPECT_NE(points[0].val_loss, points[0].bag_val_loss);
}

// Checkpoints written before [tst] existed have no such section in their run.toml; they name the
// same run as a config with TST off, and resume.
TEST_F(SuperpositionTrainerTest, CheckpointsFromBeforeTstResume) {
  const RunConfig run = config("run", 4, "bag = 1\nfraction = 0.0", /*checkpoint_interval=*/2);
  train(run, quiet());
  const fs::path checkpoint = dir_ / "run" / "checkpoint_000002";
  std::string toml = read_file(checkpoint / "run.toml");
  const size_t at = toml.find("\n[tst]\n");
  ASSERT_NE(at, std::string::npos);
  toml.erase(at, toml.find("\n[", at + 1) - at);
  ASSERT_EQ(toml.find("[tst]"), std::string::npos);
  write_file_atomic(checkpoint / "run.toml", toml);
  TrainOptions options = quiet();
  options.resume = checkpoint;
  EXPECT_NO_THROW(train(run, options));
  // A checkpoint of another run is still refused.
  RunConfig other = run;
  other.tst = {2, 0.5};
  EXPECT_THROW(train(other, options), Error);
}

TEST_F(SuperpositionTrainerTest, EveryStrategyTrainsThroughTheSwitch) {
  for (const std::string optimizer : {"adamw", "demo", "diloco"}) {
    SCOPED_TRACE(optimizer);
    std::vector<std::string> overrides = {"optimizer.name=" + optimizer, "diloco.inner_steps=2"};
    RunConfig run = config("run_" + optimizer, 6, "bag = 2\nfraction = 0.5");
    run = RunConfig::parse(run.to_toml(), "test", overrides);
    std::vector<StepStats> steps;
    TrainOptions options = quiet(&steps);
    options.simulate_peers = 2;
    const TrainSummary s = train(run, options);
    ASSERT_EQ(steps.size(), 6u);
    EXPECT_EQ(steps[2].bag, 2);
    EXPECT_EQ(steps[3].bag, 1);
    EXPECT_TRUE(std::isfinite(s.final_loss));
    EXPECT_FALSE(s.parameter_hash.empty());
  }
}

}  // namespace
}  // namespace agora
