// The trainer end to end on the bundled corpus: the loss falls, runs repeat number for number,
// a resumed run continues bit-identically, checkpoints round-trip exactly, and bad checkpoints
// and configs are refused with clear errors.
#include "agora/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../unit/test_support.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/sampler.h"
#include "agora/optim/payload.h"
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

  // AdamW unless `optimizer` says otherwise (TOML lines for the [optimizer] table and after).
  RunConfig config(const std::string& out, int64_t steps, int64_t checkpoint_interval = 0,
                   const std::string& optimizer = "name = \"adamw\"") {
    const std::string text =
        fmt::format(R"(
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
[optimizer]
{}
)",
                    kData, steps, checkpoint_interval, (dir_ / out).string(), optimizer);
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

TEST_F(TrainerTest, SimulatedDemoPeersLearnAndStayIdentical) {
  std::vector<double> losses;
  TrainOptions options = quiet(&losses);
  options.simulate_peers = 4;
  options.save_payloads = dir_ / "payloads";
  const TrainSummary s = train(config("demo", 40, 0, "name = \"demo\"\n[demo]\ntopk = 8"), options);
  // The trainer itself checks bit-identity after every exchange and would have thrown.
  EXPECT_EQ(s.simulated_peers, 4);
  EXPECT_LT(losses.back(), losses.front() - 1.0);
  EXPECT_GT(s.payload_bytes_per_peer, 0u);
  EXPECT_EQ(s.parameter_hash.size(), 64u);
  const std::string payload = read_file(dir_ / "payloads" / "step_000039_peer-003.agp");
  const Payload decoded = decode_payload(payload);
  EXPECT_EQ(decoded.kind, PayloadKind::kDemo);
  EXPECT_EQ(decoded.step, 39u);
  EXPECT_EQ(s.payload_bytes_per_peer, 40 * payload.size());
}

TEST_F(TrainerTest, SimulatedResumeIsBitIdentical) {
  const std::string demo = "name = \"demo\"\n[demo]\ntopk = 8\none_bit = true\nlookahead = true";
  TrainOptions options = quiet();
  options.simulate_peers = 2;
  const TrainSummary straight = train(config("straight", 8, 0, demo), options);
  train(config("halves", 8, 4, demo), options);
  options.resume = dir_ / "halves" / "checkpoint_000004";
  const TrainSummary resumed = train(config("halves", 8, 4, demo), options);
  EXPECT_EQ(straight.parameter_hash, resumed.parameter_hash);
  // The same checkpoint with another number of peers is refused.
  options.simulate_peers = 4;
  EXPECT_ERROR_WITH(train(config("halves", 8, 4, demo), options), "2 simulated peers",
                    "--simulate-peers 2");
  options.simulate_peers = 1;
  EXPECT_ERROR_WITH(train(config("halves", 8, 4, demo), options), "2 simulated peers");
}

TEST_F(TrainerTest, SimulatedAllReduceAndDiLoCoStayIdentical) {
  TrainOptions options = quiet();
  options.simulate_peers = 2;
  const TrainSummary adamw = train(
      config("adamw", 4, 0, "name = \"adamw\"\n[adamw]\ngradient_dtype = \"bfloat16\""), options);
  // bf16 gradients: two bytes a parameter, plus the headers.
  const auto per_step = static_cast<int64_t>(adamw.payload_bytes_per_peer / 4);
  EXPECT_GE(per_step, 2 * adamw.parameters);
  EXPECT_LT(per_step, 2 * adamw.parameters + 2048);
  const TrainSummary diloco = train(
      config("diloco", 6, 0,
             "name = \"diloco\"\n[diloco]\ninner_steps = 3\npseudo_gradient_dtype = \"int8\""),
      options);
  EXPECT_GT(diloco.payload_bytes_per_peer, 0u);
}

TEST_F(TrainerTest, SimulatedPeersMustDivideTheBatch) {
  TrainOptions options = quiet();
  options.simulate_peers = 3;
  EXPECT_ERROR_WITH(train(config("bad", 2), options), "--simulate-peers 3", "train.batch_size = 8");
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
