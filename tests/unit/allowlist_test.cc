// The allowlist file every serving role reads: one hex key per line, comments, clear errors.
#include "agora/net/allowlist.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "agora/core/error.h"

namespace agora::net {
namespace {

std::filesystem::path write(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::path(testing::TempDir()) / name;
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::filesystem::path& path) {
  try {
    read_allowlist(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AllowlistTest, ReadsKeysCommentsAndBlankLines) {
  const net::Identity a = net::Identity::generate(), b = net::Identity::generate();
  const auto path =
      write("allow_ok.txt", "# the run's peers\n" + net::key_to_hex(a.public_key()) +
                                "   # alice\n\n  " + net::key_to_hex(b.public_key()) + "\r\n");
  const auto keys = read_allowlist(path);
  EXPECT_EQ(keys, (std::set<net::PublicKey>{a.public_key(), b.public_key()}));
}

TEST(AllowlistTest, AdmissionIsOpenWithoutAFileElseTheFilesCurveKeys) {
  EXPECT_TRUE(admission_from_allowlist("").open);
  const net::Identity a = net::Identity::generate();
  const auto path = write("allow_admit.txt", net::key_to_hex(a.public_key()) + "\n");
  const net::Admission admission = admission_from_allowlist(path);
  EXPECT_FALSE(admission.open);
  EXPECT_EQ(admission.curve_keys, (std::set<std::string>{a.curve_public()}));
  EXPECT_EQ(describe(admission), "1 allowed key");
  EXPECT_EQ(describe(admission_from_allowlist("")), "open to any key");
}

TEST(AllowlistTest, BadLinesAndEmptyFilesAreNamed) {
  const auto bad = write("allow_bad.txt", "# ok\n" + std::string(64, 'a') + "\nnot-a-key\n");
  const std::string e = error_of(bad);
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("64 hexadecimal"), std::string::npos) << e;
  const std::string empty = error_of(write("allow_empty.txt", "# nobody\n"));
  EXPECT_NE(empty.find("holds no key"), std::string::npos) << empty;
  EXPECT_NE(error_of("/nonexistent/allow.txt").find("/nonexistent/allow.txt"), std::string::npos);
}

}  // namespace
}  // namespace agora::net
