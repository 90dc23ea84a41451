// core/file.h: atomic replacement of files and symlinks. A reader sees the old content or the
// new, whole; no temporary outlives its writer; two writers of one path never collide.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "test_support.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public agora::testing::TempDirTest {
 protected:
  // The names in dir_, so a test can see that no temporary is left.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(dir_)) out.push_back(entry.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_F(AtomicFileTest, WritesAndReplacesLeavingNoTemporary) {
  const fs::path path = dir_ / "state.json";
  write_file_atomic(path, "first");
  EXPECT_EQ(read_file(path), "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(names(), std::vector<std::string>{"state.json"});
}

TEST_F(AtomicFileTest, ModeIsWhatTheCallerAsked) {
  const fs::path path = dir_ / "secret.key";
  write_file_atomic(path, "seed", 0600);
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 077, 0u);
  EXPECT_NE(info.st_mode & 0400, 0u);
}

TEST_F(AtomicFileTest, StreamsAndPatchesAHeader) {
  const fs::path path = dir_ / "shard.bin";
  AtomicFile file(path);
  EXPECT_TRUE(fs::exists(file.temporary_path()));
  EXPECT_EQ(file.temporary_path().parent_path(), dir_);
  EXPECT_FALSE(fs::exists(path)) << "nothing appears at the path before commit()";
  file.append("....");
  file.append(std::string_view("body"));
  file.write_at(0, "HEAD", 4);
  file.commit();
  EXPECT_FALSE(file.is_open());
  EXPECT_EQ(read_file(path), "HEADbody");
  EXPECT_EQ(names(), std::vector<std::string>{"shard.bin"});
  EXPECT_ERROR_WITH(file.append("more"), "committed");
}

TEST_F(AtomicFileTest, AnAbandonedWriterLeavesTheOldFile) {
  const fs::path path = dir_ / "model.safetensors";
  write_file_atomic(path, "old");
  {
    AtomicFile file(path);
    file.append("half of the new");
  }  // destroyed without commit(): a failed save
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(names(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(AtomicFileTest, MovedWritersKeepOneTemporary) {
  const fs::path path = dir_ / "moved.bin";
  AtomicFile a(path);
  a.append("a");
  AtomicFile b(std::move(a));
  AtomicFile c(dir_ / "other.bin");
  c = std::move(b);  // removes other.bin's temporary
  c.commit();
  EXPECT_EQ(read_file(path), "a");
  EXPECT_EQ(names(), std::vector<std::string>{"moved.bin"});
}

TEST_F(AtomicFileTest, TwoWritersOfOnePathDoNotCollide) {
  const fs::path path = dir_ / "shared.bin";
  AtomicFile first(path), second(path);
  EXPECT_NE(first.temporary_path(), second.temporary_path());
  first.append(std::string(1000, 'a'));
  second.append(std::string(2000, 'b'));
  first.append(std::string(1000, 'a'));
  second.commit();
  first.commit();  // the last rename wins, whole
  EXPECT_EQ(read_file(path), std::string(2000, 'a'));
  EXPECT_EQ(names(), std::vector<std::string>{"shared.bin"});
}

TEST_F(AtomicFileTest, ConcurrentWritersAndReadersSeeWholeFiles) {
  const fs::path path = dir_ / "busy.bin";
  write_file_atomic(path, std::string(4096, 'x'));
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const std::string bytes = read_file(path);
      if (bytes.size() != 4096 || bytes.find_first_not_of(bytes[0]) != std::string::npos) ++torn;
    }
  });
  std::vector<std::thread> writers;
  for (char c : {'a', 'b', 'c', 'd'}) {
    writers.emplace_back([&, c] {
      for (int i = 0; i < 50; ++i) write_file_atomic(path, std::string(4096, c));
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(names(), std::vector<std::string>{"busy.bin"});
}

TEST_F(AtomicFileTest, ErrorsNameTheTemporary) {
  EXPECT_ERROR_WITH(write_file_atomic(dir_ / "missing" / "f.txt", "x"),
                    "cannot create " + (dir_ / "missing" / "f.txt").string() + ".tmp.",
                    "No such file");
}

TEST_F(AtomicFileTest, ReplacesASymlinkInOneRename) {
  fs::create_directory(dir_ / "checkpoint_000001");
  fs::create_directory(dir_ / "checkpoint_000002");
  const fs::path link = dir_ / "latest";
  replace_symlink(link, "checkpoint_000001");
  EXPECT_EQ(fs::read_symlink(link), "checkpoint_000001");
  EXPECT_TRUE(fs::is_directory(link));
  replace_symlink(link, "checkpoint_000002");
  EXPECT_EQ(fs::read_symlink(link), "checkpoint_000002");
  EXPECT_EQ(names(),
            (std::vector<std::string>{"checkpoint_000001", "checkpoint_000002", "latest"}));
  EXPECT_ERROR_WITH(replace_symlink(dir_ / "missing" / "latest", "x"), "cannot create the symlink",
                    (dir_ / "missing").string());
}

}  // namespace
}  // namespace agora
