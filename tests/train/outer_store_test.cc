// async/outer_store.h: the asynchronous server's state on disk. A save comes back whole, a file
// left by a kill between the tensors and the commit is ignored and removed, and a folder of
// another run is refused.
#include "agora/async/outer_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "agora/core/error.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class OuterStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("agora_outer_store_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static OuterTensors tensors(float value) {
    OuterTensors t;
    t.theta = {torch::full({3, 2}, value), torch::full({4}, value + 1)};
    t.momentum = {torch::full({3, 2}, -value), torch::full({4}, -value - 1)};
    t.published = {torch::full({3, 2}, value / 2), torch::full({4}, value / 2)};
    return t;
  }

  fs::path dir_;
};

TEST_F(OuterStoreTest, ASaveComesBackWhole) {
  {
    OuterStore store(dir_, "run A");
    EXPECT_FALSE(store.load().has_value());
    const OuterTensors t = tensors(1.5f);
    store.save({{"version", 3}}, &t);
    store.save({{"version", 4}}, nullptr);  // the ledger moved, theta did not
  }
  OuterStore store(dir_, "run A");
  const std::optional<OuterSave> save = store.load();
  ASSERT_TRUE(save.has_value());
  EXPECT_EQ(save->state["version"], 4);
  ASSERT_EQ(save->tensors.theta.size(), 2u);
  EXPECT_TRUE(torch::equal(save->tensors.theta[1], torch::full({4}, 2.5f)));
  EXPECT_TRUE(torch::equal(save->tensors.momentum[0], torch::full({3, 2}, -1.5f)));
  EXPECT_TRUE(torch::equal(save->tensors.published[0], torch::full({3, 2}, 0.75f)));
  EXPECT_TRUE(save->tensors.round_sum.empty());
  // One tensor file: the one the save names.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_))
    files += e.path().filename().string().rfind("tensors-", 0) == 0;
  EXPECT_EQ(files, 1);
}

TEST_F(OuterStoreTest, AFileNoSaveNamesIsIgnoredAndRemoved) {
  {
    OuterStore store(dir_, "run A");
    const OuterTensors t = tensors(1.0f);
    store.save({{"version", 1}}, &t);
  }
  // What a kill between writing the next tensor file and committing its save leaves.
  fs::copy_file(dir_ / "tensors-1.safetensors", dir_ / "tensors-2.safetensors");
  OuterStore store(dir_, "run A");
  EXPECT_FALSE(fs::exists(dir_ / "tensors-2.safetensors"));
  const auto save = store.load();
  ASSERT_TRUE(save.has_value());
  EXPECT_EQ(save->state["version"], 1);
  // The next save does not collide with the removed file's name.
  const OuterTensors t = tensors(2.0f);
  store.save({{"version", 2}}, &t);
  EXPECT_TRUE(
      torch::equal(OuterStore(dir_, "run A").load()->tensors.theta[0], torch::full({3, 2}, 2.0f)));
}

TEST_F(OuterStoreTest, AnotherRunsFolderIsRefusedAndClearStartsAnew) {
  {
    OuterStore store(dir_, "run A");
    const OuterTensors t = tensors(1.0f);
    store.save({{"version", 1}}, &t);
    store.save_snapshot(0, t.theta);
    EXPECT_TRUE(torch::equal(store.load_snapshot(0)[1], torch::full({4}, 2.0f)));
  }
  try {
    OuterStore other(dir_, "run B");
    FAIL() << "a folder of another run was opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another run config"), std::string::npos) << e.what();
  }
  {
    OuterStore store(dir_, "run A");
    store.clear();
    EXPECT_FALSE(store.load().has_value());
    EXPECT_FALSE(fs::exists(dir_ / "snapshot-0.safetensors"));
  }
  // A finished run's folder is free for another run.
  {
    OuterStore store(dir_, "run A");
    const OuterTensors t = tensors(1.0f);
    store.save({{"version", 9}, {"finished", true}}, &t);
  }
  OuterStore next(dir_, "run B");
  EXPECT_FALSE(next.load().has_value());
}

}  // namespace
}  // namespace agora
