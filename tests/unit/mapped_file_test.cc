#include "agora/core/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "test_support.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public agora::testing::TempDirTest {};

std::string as_string(std::span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST_F(MappedFileTest, MapsTheWholeFile) {
  std::string content = "hello, mapped world";
  content += std::string(1, '\0');
  content += std::string(10000, '\xab');  // spans more than one page
  const fs::path path = dir_ / "data.bin";
  write_file_atomic(path, content);

  const MappedFile file = MappedFile::open(path, "test file");
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.bytes().size(), content.size());
  EXPECT_EQ(as_string(file.bytes()), content);
}

TEST_F(MappedFileTest, EmptyFileHasNoBytes) {
  const fs::path path = dir_ / "empty.bin";
  write_file_atomic(path, "");
  const MappedFile file = MappedFile::open(path, "test file");
  EXPECT_EQ(file.path(), path);
  EXPECT_TRUE(file.bytes().empty());
}

TEST_F(MappedFileTest, ErrorsNameThePathAndTheKind) {
  const fs::path missing = dir_ / "missing.bin";
  EXPECT_ERROR_WITH(MappedFile::open(missing, "widget"), "cannot open widget " + missing.string(),
                    "No such file");
  EXPECT_ERROR_WITH(MappedFile::open(dir_, "widget"), "widget " + dir_.string(),
                    "not a regular file");
}

TEST_F(MappedFileTest, DefaultIsEmpty) {
  const MappedFile file;
  EXPECT_TRUE(file.path().empty());
  EXPECT_TRUE(file.bytes().empty());
}

TEST_F(MappedFileTest, MoveHandsOverTheMapping) {
  const fs::path path = dir_ / "data.bin";
  write_file_atomic(path, "0123456789");

  MappedFile a = MappedFile::open(path, "test file");
  const uint8_t* data = a.bytes().data();
  MappedFile b(std::move(a));
  EXPECT_TRUE(a.bytes().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_TRUE(a.path().empty());   // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.bytes().data(), data);
  EXPECT_EQ(as_string(b.bytes()), "0123456789");
  EXPECT_EQ(b.path(), path);

  // Assigning over a live mapping releases it and takes the other one.
  const fs::path other_path = dir_ / "other.bin";
  write_file_atomic(other_path, "abc");
  MappedFile c = MappedFile::open(other_path, "test file");
  c = std::move(b);
  EXPECT_TRUE(b.bytes().empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(as_string(c.bytes()), "0123456789");
  EXPECT_EQ(c.path(), path);

  // Self-move leaves the object usable, and moved-from objects destroy safely at scope end.
  MappedFile& alias = c;
  c = std::move(alias);
  EXPECT_EQ(as_string(c.bytes()), "0123456789");
  a = std::move(b);  // empty into empty
  EXPECT_TRUE(a.bytes().empty());
}

TEST_F(MappedFileTest, BytesOutliveTheFileName) {
  // The mapping holds the file: removing or replacing the name does not touch mapped bytes.
  const fs::path path = dir_ / "data.bin";
  write_file_atomic(path, "original");
  const MappedFile file = MappedFile::open(path, "test file");
  write_file_atomic(path, "replaced by rename");
  EXPECT_EQ(as_string(file.bytes()), "original");
  fs::remove(path);
  EXPECT_EQ(as_string(file.bytes()), "original");
}

}  // namespace
}  // namespace agora
