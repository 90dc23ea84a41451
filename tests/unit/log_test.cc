// Log lines: the text and JSON forms, with and without step and peer.
#include "agora/obs/log.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agora/core/error.h"

namespace agora::obs {
namespace {

constexpr double kAt = 1714564801.234;  // 2024-05-01T12:00:01.234Z

TEST(Log, JsonLines) {
  const std::string line = format_log_line(LogFormat::kJson, "peer", LogLevel::kInfo,
                                           {12, "487f147b"}, "loss \"3.2\"\n", kAt);
  EXPECT_EQ(line,
            "{\"ts\":\"2024-05-01T12:00:01.234Z\",\"level\":\"info\",\"msg\":\"loss "
            "\\\"3.2\\\"\\n\",\"step\":12,\"peer\":\"487f147b\",\"process\":\"peer\"}");
  const auto j = nlohmann::json::parse(
      format_log_line(LogFormat::kJson, "coordinator", LogLevel::kWarn, {}, "x", kAt));
  EXPECT_EQ(j["level"], "warn");
  EXPECT_FALSE(j.contains("step"));
  EXPECT_FALSE(j.contains("peer"));
  // Bytes that are not UTF-8 still make a line that parses.
  const std::string bad =
      format_log_line(LogFormat::kJson, "c", LogLevel::kInfo, {}, "bad \xff byte", kAt);
  EXPECT_TRUE(nlohmann::json::accept(bad)) << bad;
}

TEST(Log, TextLines) {
  const std::string line = format_log_line(LogFormat::kText, "peer", LogLevel::kInfo,
                                           {7, "487f147b"}, "joined run", kAt);
  // The clock part is local time; the rest is fixed.
  EXPECT_EQ(line.substr(12), " info  peer 487f147b step 7: joined run");
  EXPECT_EQ(
      format_log_line(LogFormat::kText, "coordinator", LogLevel::kError, {}, "x", kAt).substr(12),
      " error coordinator: x");
}

TEST(Log, ParsesFormats) {
  EXPECT_EQ(parse_log_format("text"), LogFormat::kText);
  EXPECT_EQ(parse_log_format("json"), LogFormat::kJson);
  try {
    parse_log_format("yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--log-format yaml"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("text"), std::string::npos);
  }
}

}  // namespace
}  // namespace agora::obs
