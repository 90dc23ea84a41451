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

TEST(AllowlistTest, AdmissionIsTheFilesCurveKeysOrOpenWhenSaidSo) {
  const net::Identity a = net::Identity::generate();
  const auto path = write("allow_admit.txt", net::key_to_hex(a.public_key()) + "\n");
  const AdmissionNames names{"--allowlist", "--open"};
  const net::Admission admission = admission_for(path, false, names);
  EXPECT_FALSE(admission.open);
  EXPECT_EQ(admission.curve_keys, (std::set<std::string>{a.curve_public()}));
  EXPECT_EQ(describe(admission), "1 allowed key");
  const net::Admission open = admission_for("", true, names);
  EXPECT_TRUE(open.open);
  EXPECT_EQ(describe(open), "open to any key");
}

TEST(AllowlistTest, AdmissionMustBeSaidOnceNeitherOpenByDefaultNorBoth) {
  const auto error = [](const std::filesystem::path& path, bool open) {
    try {
      admission_for(path, open, {"network.allowlist", "network.open"});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string neither = error("", false);
  EXPECT_NE(neither.find("set network.allowlist"), std::string::npos) << neither;
  EXPECT_NE(neither.find("or network.open"), std::string::npos) << neither;
  const auto path = write("allow_both.txt", std::string(64, 'a') + "\n");
  const std::string both = error(path, true);
  EXPECT_NE(both.find("both network.allowlist"), std::string::npos) << both;
  EXPECT_NE(both.find("choose one"), std::string::npos) << both;
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
