// A stage's checkpoint (pipeline/stage_checkpoint.h): what is saved comes back bit for bit, an
// interrupted or foreign checkpoint does not count, old ones are pruned, and a damaged state
// file is an error naming the tensor. (That a resumed run of stage processes ends with the
// uninterrupted run's bits is tests/integration/pipeline_test.py, resume_*.)
#include "agora/pipeline/stage_checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "../unit/test_support.h"
#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/optim/chunking.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/stage_optimizer.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

RunConfig config(const std::string& optimizer = "nadam") {
  return RunConfig::parse(fmt::format(R"(
seed = 5
[model]
preset = "tiny"
vocab_size = 512
num_layers = 3
tie_embeddings = false
[data]
seq_len = 16
[train]
steps = 10
batch_size = 2
micro_batch_size = 2
[schedule]
warmup_steps = 0
[pipeline]
stages = 3
schedule = "async"
optimizer = "{}"
codec = "subspace"
subspace_rank = 8
)",
                                      optimizer),
                          "test");
}

class StageCheckpointTest : public ::testing::Test {
 protected:
  StageCheckpointTest()
      : run_(config()),
        subspace_(run_.model, 8, run_.seed, torch::kCPU),
        span_(partition_model(run_.model, 3).at(0)),
        fingerprint_(stage_run_fingerprint(run_)) {
    dir_ = fs::temp_directory_path() /
           fmt::format("agora-stage-ckpt-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  ~StageCheckpointTest() override { fs::remove_all(dir_); }

  StageModel model() const { return StageModel(run_.model, span_, run_.seed, &subspace_); }

  // A stage 0 that has taken `steps` NAdam steps on made-up gradients.
  void train(StageModel& m, StageOptimizer& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      for (torch::Tensor& p : m->parameters()) p.mutable_grad() = torch::randn_like(p);
      opt.step(1e-2);
      m->constrain_to_subspace();
    }
  }

  RunConfig run_;
  SubspaceBasis subspace_;
  StageSpan span_;
  std::string fingerprint_;
  fs::path dir_;
};

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

TEST_F(StageCheckpointTest, RoundTripIsExact) {
  torch::manual_seed(1);
  StageModel m = model();
  StageOptimizer opt(run_, m->hf_parameters());
  train(m, opt, 3);
  StageCheckpoint state;
  state.steps = 3;
  state.optimizer = opt.state();
  for (const torch::Tensor& p : m->parameters())
    state.stashes[4].version.push_back(p.detach().clone() + 1);
  state.unconsumed[{5, 0}] = std::string("\x00\x01\xff raw bytes", 14);
  state.unconsumed[{5, 1}] = "";
  save_stage_checkpoint(dir_, m, &subspace_, fingerprint_, state);
  EXPECT_EQ(stage_checkpoint_steps(dir_, 0, fingerprint_), std::vector<uint64_t>{3});
  EXPECT_TRUE(stage_checkpoint_steps(dir_, 1, fingerprint_).empty());

  StageModel back = model();
  StageOptimizer back_opt(run_, back->hf_parameters());
  const StageCheckpoint loaded = load_stage_checkpoint(dir_, 3, back, fingerprint_);
  back_opt.load_state(loaded.optimizer);
  auto a = m->parameters(), b = back->parameters();
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same(a[k], b[k])) << k;
  ASSERT_EQ(loaded.stashes.size(), 1u);
  ASSERT_EQ(loaded.stashes.at(4).version.size(), state.stashes[4].version.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(same(loaded.stashes.at(4).version[k], state.stashes[4].version[k]));
  }
  EXPECT_EQ(loaded.unconsumed, state.unconsumed);
  // The optimizers continue identically from there.
  torch::manual_seed(2);
  train(m, opt, 2);
  torch::manual_seed(2);
  train(back, back_opt, 2);
  a = m->parameters();
  b = back->parameters();
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same(a[k], b[k])) << k;
}

TEST_F(StageCheckpointTest, KeepsTheNewestAndIgnoresInterruptedOrForeignOnes) {
  StageModel m = model();
  StageOptimizer opt(run_, m->hf_parameters());
  for (int64_t steps : {2, 4, 6}) {
    StageCheckpoint state;
    state.steps = steps;
    state.optimizer = opt.state();
    save_stage_checkpoint(dir_, m, &subspace_, fingerprint_, state, /*keep=*/2);
  }
  EXPECT_EQ(stage_checkpoint_steps(dir_, 0, fingerprint_), (std::vector<uint64_t>{4, 6}));
  EXPECT_FALSE(fs::exists(dir_ / "step_2"));
  // Another run's fingerprint: nothing of this one's.
  EXPECT_TRUE(stage_checkpoint_steps(dir_, 0, std::string(32, 'z')).empty());
  // A crash between the state file and the parameters: step 6 no longer counts.
  fs::remove(dir_ / "step_6" / "stage_0.safetensors");
  EXPECT_EQ(stage_checkpoint_steps(dir_, 0, fingerprint_), std::vector<uint64_t>{4});
  StageModel other = model();
  EXPECT_ERROR_WITH(load_stage_checkpoint(dir_, 6, other, fingerprint_),
                    "no complete checkpoint of stage 0 at step 6");
  // A truncated state file is no checkpoint either.
  const fs::path state = dir_ / "step_4" / "stage_0.state.safetensors";
  fs::resize_file(state, fs::file_size(state) / 2);
  EXPECT_TRUE(stage_checkpoint_steps(dir_, 0, fingerprint_).empty());
  EXPECT_TRUE(stage_checkpoint_steps(dir_ / "missing", 0, fingerprint_).empty());
}

TEST_F(StageCheckpointTest, AStateFileWithStrangeTensorsIsRefusedByName) {
  StageModel m = model();
  StageOptimizer opt(run_, m->hf_parameters());
  StageCheckpoint state;
  state.steps = 2;
  save_stage_checkpoint(dir_, m, &subspace_, fingerprint_, state);
  const fs::path path = dir_ / "step_2" / "stage_0.state.safetensors";
  const auto rewrite = [&](const std::string& name, torch::Tensor t) {
    save_tensors(path, {{name, t}},
                 {{"step", "2"}, {"stage", "0"}, {"fingerprint", hex_encode(fingerprint_)}});
  };
  StageModel other = model();
  rewrite("weights/x", torch::zeros({1}));
  EXPECT_ERROR_WITH(load_stage_checkpoint(dir_, 2, other, fingerprint_),
                    "unknown tensor weights/x");
  rewrite("sent/3/x", torch::zeros({1}, torch::kUInt8));
  EXPECT_ERROR_WITH(load_stage_checkpoint(dir_, 2, other, fingerprint_),
                    "sent/3/x does not name a step and a number");
  rewrite("sent/3/0", torch::zeros({2, 2}));
  EXPECT_ERROR_WITH(load_stage_checkpoint(dir_, 2, other, fingerprint_), "sent/3/0 is not bytes");
  rewrite("stash/3/version/1", torch::zeros({1}));
  EXPECT_ERROR_WITH(load_stage_checkpoint(dir_, 2, other, fingerprint_),
                    "the stash of step 3 is incomplete");
}

TEST(StageRunFingerprint, SeesWhatStagesMustShareAndNothingElse) {
  const RunConfig base = config();
  RunConfig local = base;
  local.train.out_dir = "elsewhere";
  local.train.threads = 7;
  local.data.dir = "/mnt/tokens";
  local.train.checkpoint_interval = 3;
  EXPECT_EQ(stage_run_fingerprint(local), stage_run_fingerprint(base));
  RunConfig other = base;
  other.pipeline.subspace_rank = 16;
  EXPECT_NE(stage_run_fingerprint(other), stage_run_fingerprint(base));
  other = base;
  other.model.num_layers = 6;
  EXPECT_NE(stage_run_fingerprint(other), stage_run_fingerprint(base));
  other = base;
  other.seed = 6;
  EXPECT_NE(stage_run_fingerprint(other), stage_run_fingerprint(base));
  EXPECT_EQ(stage_run_fingerprint(base).size(), 32u);
}

// The swarm coordinator checks every round contribution against its stage's DeMo layout without
// libtorch (swarm/contribution_check.h), from stage_parameter_shapes: the names, shapes and
// order must be the stage model's own, or honest contributions would be refused.
TEST(StageParameterShapes, AreTheStageModelsOwnInOrder) {
  const RunConfig run = config();
  const std::vector<StageSpan> spans = partition_model(run.model, 3);
  for (const StageSpan& span : spans) {
    const StageModel stage(run.model, span, run.seed, nullptr);
    const std::vector<NamedParameter> real = stage->hf_parameters();
    const std::vector<ParameterShape> shapes = stage_parameter_shapes(run.model, span);
    ASSERT_EQ(shapes.size(), real.size()) << "stage " << span.stage;
    int64_t count = 0;
    for (size_t i = 0; i < real.size(); ++i) {
      EXPECT_EQ(shapes[i].name, real[i].name) << "stage " << span.stage;
      EXPECT_EQ(shapes[i].shape,
                std::vector<int64_t>(real[i].tensor.sizes().begin(), real[i].tensor.sizes().end()))
          << shapes[i].name;
      count += real[i].tensor.numel();
    }
    EXPECT_EQ(count, span.parameters) << "stage " << span.stage;
    DemoOptions demo;
    demo.chunk = run.demo.chunk;
    demo.topk = run.demo.topk;
    demo.one_bit = run.demo.one_bit;
    const DecoupledMomentum momentum(stage->hf_parameters(), demo);
    PayloadLayout layout;
    for (const ParameterShape& p : shapes) {
      layout.tensors.push_back(
          demo_tensor_layout(p.shape, run.demo.chunk, run.demo.topk, run.demo.one_bit));
    }
    EXPECT_EQ(layout.tensors, momentum.payload_layout().tensors) << "stage " << span.stage;
  }
}

}  // namespace
}  // namespace agora
