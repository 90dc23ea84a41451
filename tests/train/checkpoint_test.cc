// train/checkpoint.h: replacing a checkpoint folder never deletes the old one before the new one
// is in place, and what a crash leaves at any step of the replacement (DIR.tmp, DIR.replaced) is
// recovered by the next save: the folder then holds the old checkpoint or the new one, whole.
// The crashes themselves are simulated here by building the leftovers a kill at each crash point
// leaves; tests/integration/crash_test.py kills real processes there.
#include "agora/train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../unit/test_support.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

class CheckpointTest : public agora::testing::TempDirTest {
 protected:
  // A tiny model whose parameters all equal `value`, so checkpoints are told apart by content.
  static Llama model_filled(float value) {
    Llama model(model_preset("tiny", 256, 32));
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(value);
    return model;
  }
  void save(const fs::path& dir, float value, int64_t step) {
    Llama model = model_filled(value);
    CheckpointMeta meta;
    meta.step = step;
    save_checkpoint(dir, model, meta, "gpt2", "seed = 1\n", std::nullopt);
  }
  // The value every parameter of the checkpoint in `dir` holds (checked to be one value).
  static float value_in(const fs::path& dir) {
    const LoadedCheckpoint loaded = load_checkpoint(dir, torch::kCPU);
    const torch::Tensor first = loaded.model->parameters().front();
    const float v = first.flatten()[0].item<float>();
    for (const auto& p : loaded.model->parameters()) EXPECT_TRUE(torch::all(p == v).item<bool>());
    return v;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(dir_)) out.push_back(entry.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_F(CheckpointTest, ReplacesWholeAndLeavesNothingBehind) {
  const fs::path dir = dir_ / "checkpoint_000002";
  save(dir, 1.0f, 2);
  EXPECT_EQ(value_in(dir), 1.0f);
  save(dir, 2.0f, 2);
  EXPECT_EQ(value_in(dir), 2.0f);
  EXPECT_EQ(names(), std::vector<std::string>{"checkpoint_000002"});
}

TEST_F(CheckpointTest, OldCheckpointIsMovedAsideNotDeletedBeforeTheNewOneIsIn) {
  // The old folder's inode is the one that ends up as DIR.replaced: a hard link to a file in it
  // still names the old bytes after the replace, so the old folder was renamed, not rewritten.
  const fs::path dir = dir_ / "checkpoint_000004";
  save(dir, 1.0f, 4);
  const std::string old_weights = read_file(dir / "model.safetensors");
  fs::create_hard_link(dir / "model.safetensors", dir_ / "old_weights_link");
  save(dir, 3.0f, 4);
  EXPECT_EQ(read_file(dir_ / "old_weights_link"), old_weights);
  EXPECT_EQ(value_in(dir), 3.0f);
  EXPECT_FALSE(fs::exists(dir_ / "checkpoint_000004.replaced"));
}

TEST_F(CheckpointTest, KilledAfterTheOldOneWentAsideTheNextSavePutsItBack) {
  // A kill at checkpoint.after_aside: DIR absent, DIR.replaced the old one, DIR.tmp the new one.
  const fs::path dir = dir_ / "checkpoint_000002";
  save(dir, 1.0f, 2);
  save(dir_ / "new", 2.0f, 2);
  fs::rename(dir, dir_ / "checkpoint_000002.replaced");
  fs::rename(dir_ / "new", dir_ / "checkpoint_000002.tmp");
  // Loading does not read either leftover, and says where the old checkpoint is.
  EXPECT_ERROR_WITH(load_checkpoint(dir, torch::kCPU), "no such folder",
                    "checkpoint_000002.replaced");
  // The next checkpoint written into the folder (another step) restores it first.
  save(dir_ / "checkpoint_000004", 4.0f, 4);
  EXPECT_EQ(value_in(dir), 1.0f);
  EXPECT_EQ(names(), (std::vector<std::string>{"checkpoint_000002", "checkpoint_000004"}));
}

TEST_F(CheckpointTest, KilledAfterTheNewOneWentInTheNextSaveDropsTheOld) {
  // A kill at checkpoint.after_rename or after_sync: DIR the new one, DIR.replaced the old one.
  const fs::path dir = dir_ / "checkpoint_000002";
  save(dir, 2.0f, 2);
  save(dir_ / "old", 1.0f, 2);
  fs::rename(dir_ / "old", dir_ / "checkpoint_000002.replaced");
  recover_checkpoints(dir_);
  EXPECT_EQ(value_in(dir), 2.0f);
  EXPECT_EQ(names(), std::vector<std::string>{"checkpoint_000002"});
}

TEST_F(CheckpointTest, HalfWrittenTemporaryIsRemovedAndNeverLoaded) {
  // A kill at checkpoint.begin .. after_tmp: DIR.tmp partial; the old DIR untouched.
  const fs::path dir = dir_ / "checkpoint_000006";
  save(dir, 1.0f, 6);
  fs::create_directories(dir_ / "checkpoint_000006.tmp");
  write_file_atomic(dir_ / "checkpoint_000006.tmp" / "config.json", "{");
  fs::create_directories(dir_ / "checkpoint_000008.tmp");  // a step never written whole
  EXPECT_EQ(value_in(dir), 1.0f);
  save(dir, 6.0f, 6);
  EXPECT_EQ(value_in(dir), 6.0f);
  EXPECT_EQ(names(), std::vector<std::string>{"checkpoint_000006"});
}

TEST_F(CheckpointTest, SweepLeavesFoldersThatAreNotCheckpointsAlone) {
  fs::create_directories(dir_ / "data.tmp");
  fs::create_directories(dir_ / "notes.replaced");
  save(dir_ / "checkpoint_000001", 1.0f, 1);
  EXPECT_EQ(names(),
            (std::vector<std::string>{"checkpoint_000001", "data.tmp", "notes.replaced"}));
}

TEST_F(CheckpointTest, StaleLinkTemporaryIsRemovedAndLatestKept) {
  // A kill at symlink.before_rename leaves "latest.tmp.<pid>.<n>"; latest still names the old.
  save(dir_ / "checkpoint_000001", 1.0f, 1);
  replace_symlink(dir_ / "latest", "checkpoint_000001");
  fs::create_symlink("checkpoint_000002", dir_ / "latest.tmp.4242.0");
  save(dir_ / "checkpoint_000002", 2.0f, 2);
  EXPECT_EQ(names(), (std::vector<std::string>{"checkpoint_000001", "checkpoint_000002",
                                               "latest"}));
  EXPECT_EQ(value_in(dir_ / "latest"), 1.0f);
}

}  // namespace
}  // namespace agora
