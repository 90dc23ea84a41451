// The trainer end to end on the bundled corpus: the loss falls, runs repeat number for number,
// a resumed run continues bit-identically, checkpoints round-trip exactly, and bad checkpoints
// and configs are refused with clear errors.
#include "agora/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/sampler.h"
#include "agora/train/checkpoint.h"
#include "agora/train/evaluate.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

const std::string kData = AGORA_DATA_DIR "/tokens/sp8k";

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kData + "/meta.json"))
        << kData << " is missing: run 'make data' (make test does it)";
    dir_ = fs::temp_directory_path() / ("agora_trainer_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunConfig config(const std::string& out, int64_t steps, int64_t checkpoint_interval = 0) {
    const std::string text = fmt::format(R"(
seed = 11
[model]
preset = "tiny"
[data]
dir = "{}"
seq_len = 32
[train]
steps = {}
batch_size = 8
micro_batch_size = 4
eval_interval = 0
eval_windows = 4
checkpoint_interval = {}
out_dir = "{}"
device = "cpu"
threads = 1
[schedule]
kind = "cosine"
warmup_steps = 1
)",
                                         kData, steps, checkpoint_interval, (dir_ / out).string());
    return RunConfig::parse(text, "test");
  }

  static TrainOptions quiet(std::vector<double>* losses = nullptr) {
    TrainOptions options;
    options.progress = false;
    if (losses) options.on_step = [losses](const StepStats& s) { losses->push_back(s.loss); };
    return options;
  }

  fs::path dir_;
};

TEST_F(TrainerTest, LossFalls) {
  std::vector<double> losses;
  const TrainSummary s = train(config("run", 60), quiet(&losses));
  ASSERT_EQ(losses.size(), 60u);
  EXPECT_GT(losses.front(), 8.5);  // ~ln(8192) = 9.01 at initialisation
  EXPECT_LT(losses.back(), losses.front() - 1.5);
  EXPECT_LT(s.val_loss, 7.5);
  EXPECT_TRUE(fs::exists(s.checkpoint / "model.safetensors"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "run" / "latest"));
}

TEST_F(TrainerTest, Bfloat16AutocastTrains) {
  RunConfig c = config("bf16", 3);
  c.train.dtype = "bfloat16";
  std::vector<double> losses;
  train(c, quiet(&losses));
  ASSERT_EQ(losses.size(), 3u);
  for (const double loss : losses) EXPECT_TRUE(std::isfinite(loss));
}

TEST_F(TrainerTest, SameConfigSameNumbers) {
  std::vector<double> a, b;
  train(config("a", 8), quiet(&a));
  train(config("b", 8), quiet(&b));
  EXPECT_EQ(a, b);
  EXPECT_EQ(read_file(dir_ / "a" / "checkpoint_000008" / "model.safetensors"),
            read_file(dir_ / "b" / "checkpoint_000008" / "model.safetensors"));
}

TEST_F(TrainerTest, ResumeIsBitIdentical) {
  std::vector<double> straight, first_half, second_half;
  train(config("straight", 12), quiet(&straight));
  train(config("halves", 12, 6), quiet(&first_half));  // writes checkpoints at 6 and 12
  // Continue from step 6 in a fresh run with the same config.
  fs::rename(dir_ / "halves" / "checkpoint_000012", dir_ / "halves_first_end");
  TrainOptions options = quiet(&second_half);
  options.resume = dir_ / "halves" / "checkpoint_000006";
  const TrainSummary s = train(config("halves", 12, 6), options);
  EXPECT_EQ(s.first_step, 6);
  ASSERT_EQ(second_half.size(), 6u);
  EXPECT_EQ(std::vector<double>(straight.begin() + 6, straight.end()), second_half);
  EXPECT_EQ(read_file(dir_ / "straight" / "checkpoint_000012" / "model.safetensors"),
            read_file(dir_ / "halves" / "checkpoint_000012" / "model.safetensors"));
  EXPECT_EQ(read_file(dir_ / "straight" / "checkpoint_000012" / "training_state.safetensors"),
            read_file(dir_ / "halves" / "checkpoint_000012" / "training_state.safetensors"));
}

TEST_F(TrainerTest, ResumeRefusesADifferentConfig) {
  train(config("run", 4), quiet());
  RunConfig other = config("run", 8);
  other.optimizer.lr = 1e-4;
  TrainOptions options = quiet();
  options.resume = dir_ / "run" / "checkpoint_000004";
  try {
    train(other, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different run config"), std::string::npos) << e.what();
  }
}

TEST_F(TrainerTest, CheckpointRoundTripIsExact) {
  const TrainSummary s = train(config("run", 3), quiet());
  LoadedCheckpoint loaded = load_checkpoint(s.checkpoint, torch::kCPU);
  EXPECT_EQ(loaded.meta.step, 3);
  EXPECT_EQ(loaded.meta.tokenizer, "tokenizer.model");
  const auto saved = load_tensors(s.checkpoint / "model.safetensors");
  for (const auto& item : loaded.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), saved.at(item.key()))) << item.key();
  }
  // Saving the loaded model again gives the same bytes.
  save_checkpoint(dir_ / "again", loaded.model, loaded.meta, loaded.tokenizer_spec,
                  loaded.run_config_toml, std::nullopt);
  EXPECT_EQ(read_file(dir_ / "again" / "model.safetensors"),
            read_file(s.checkpoint / "model.safetensors"));
  // Evaluation of the loaded model equals the one recorded at the end of training.
  const Sampler val = Sampler::from_directory(kData, "val", 32, 11);
  EXPECT_DOUBLE_EQ(evaluate(loaded.model, val, 4, 4).loss, s.val_loss);
}

void expect_error(const fs::path& checkpoint, const std::string& needle) {
  try {
    load_checkpoint(checkpoint, torch::kCPU);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(TrainerTest, RejectsMalformedCheckpoints) {
  const TrainSummary s = train(config("run", 1), quiet());
  const fs::path bad = dir_ / "bad";
  const auto fresh = [&] {
    fs::remove_all(bad);
    fs::copy(s.checkpoint, bad);
  };
  fresh();
  auto tensors = load_tensors(bad / "model.safetensors");
  tensors.erase("model.norm.weight");
  save_tensors(bad / "model.safetensors", {tensors.begin(), tensors.end()}, {});
  expect_error(bad, "tensor model.norm.weight is missing");

  fresh();
  tensors = load_tensors(bad / "model.safetensors");
  tensors["model.norm.weight"] = torch::ones({3});
  save_tensors(bad / "model.safetensors", {tensors.begin(), tensors.end()}, {});
  expect_error(bad, "has shape [3]");

  fresh();
  tensors = load_tensors(bad / "model.safetensors");
  tensors["extra.weight"] = torch::ones({3});
  save_tensors(bad / "model.safetensors", {tensors.begin(), tensors.end()}, {});
  expect_error(bad, "unexpected tensor extra.weight");

  fresh();
  const std::string bytes = read_file(bad / "model.safetensors");
  write_file_atomic(bad / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_error(bad, "model.safetensors");

  fresh();
  write_file_atomic(bad / "config.json", R"({"hidden_size": 64})");
  expect_error(bad, "missing key");

  fresh();
  write_file_atomic(bad / "config.json", "{not json");
  expect_error(bad, "not valid JSON");

  expect_error(dir_ / "nowhere", "no such folder");
}

}  // namespace
}  // namespace agora
