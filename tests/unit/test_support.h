// Shared by the unit tests: a fresh temporary folder per test, and an assertion that an
// expression throws agora::Error with a message naming what it must name.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "agora/core/error.h"

namespace agora::testing {

// SetUp makes dir_ (unique, under the system temp folder); TearDown removes it.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "agora_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

}  // namespace agora::testing

// Runs `expr`, expects an agora::Error whose message contains every string in `parts`.
#define EXPECT_ERROR_WITH(expr, ...)                                          \
  do {                                                                        \
    try {                                                                     \
      expr;                                                                   \
      ADD_FAILURE() << "expected an Error from " #expr;                       \
    } catch (const ::agora::Error& e) {                                       \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)        \
            << "message \"" << e.what() << "\" lacks \"" << part << "\"";     \
      }                                                                       \
    }                                                                         \
  } while (0)
