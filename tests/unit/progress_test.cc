#include "agora/obs/progress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

namespace agora {
namespace {

TEST(FormatBytes, UsesDecimalUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(999), "999 B");
  EXPECT_EQ(format_bytes(1000), "1.0 KB");
  EXPECT_EQ(format_bytes(13'100'000), "13.1 MB");
  EXPECT_EQ(format_bytes(2.5e9), "2.5 GB");
}

TEST(FormatDuration, HoursMinutesSeconds) {
  EXPECT_EQ(format_duration(0), "0:00:00");
  EXPECT_EQ(format_duration(65), "0:01:05");
  EXPECT_EQ(format_duration(3 * 3600 + 7), "3:00:07");
  EXPECT_EQ(format_duration(NAN), "-:--:--");
  EXPECT_EQ(format_duration(-1), "-:--:--");
}

TEST(Progress, ConcurrentAddsAreCounted) {
  testing::internal::CaptureStderr();
  {
    Progress progress("test", 4000);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) progress.add(1);
      });
    }
    for (auto& thread : threads) thread.join();
  }
  const std::string out = testing::internal::GetCapturedStderr();
  // The final line reports the whole amount, whatever the interleaving.
  EXPECT_NE(out.find("test  4.0 KB in"), std::string::npos) << out;
}

}  // namespace
}  // namespace agora
