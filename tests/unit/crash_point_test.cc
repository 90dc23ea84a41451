// core/crash_point.h: AGORA_CRASH_AT parses as NAME[:N] with NAME a listed point, a bad value is
// an Error naming the value and the allowed form, and an armed point kills with SIGKILL at its
// N-th pass and not before (checked in a forked child, so the test process lives on).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "agora/core/crash_point.h"
#include "test_support.h"

namespace agora {
namespace {

TEST(CrashPoint, ParsesNameAndCount) {
  EXPECT_EQ(parse_crash_at("store.save.after_begin"), (CrashAt{"store.save.after_begin", 1}));
  EXPECT_EQ(parse_crash_at("store.save.after_begin:1"), (CrashAt{"store.save.after_begin", 1}));
  EXPECT_EQ(parse_crash_at("checkpoint.after_aside:12"), (CrashAt{"checkpoint.after_aside", 12}));
}

TEST(CrashPoint, RejectsMalformedValuesNamingTheForm) {
  const std::string form = "NAME or NAME:N";
  EXPECT_ERROR_WITH(parse_crash_at(""), "AGORA_CRASH_AT=\"\"", "empty", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begn"), "'store.save.begn' is not a crash point",
                    form, "crash_point.h");
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin:0"), "'0'", ">= 1", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin:"), "''", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin:-1"), "'-1'", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin:2x"), "'2x'", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin:99999999999999999999999"), form);
  EXPECT_ERROR_WITH(parse_crash_at(":3"), "'' is not a crash point", form);
  EXPECT_ERROR_WITH(parse_crash_at("store.save.begin "), "not a crash point", form);
}

TEST(CrashPoint, EveryListedPointParsesAndNamesAreUnique) {
  std::set<std::string_view> seen;
  for (const std::string_view point : crash_points()) {
    EXPECT_TRUE(seen.insert(point).second) << point << " is listed twice";
    EXPECT_EQ(parse_crash_at(std::string(point) + ":3").point, point);
  }
  // The integration tests draw from these: the coordinator's save path and a checkpoint's write.
  EXPECT_GE(seen.size(), 20u);
}

// Runs `body` in a forked child with AGORA_CRASH_AT=`value`; returns its wait status.
template <typename Body>
int in_child(const char* value, Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("AGORA_CRASH_AT", value, 1);
    try {
      check_crash_at();
      body();
    } catch (const Error&) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(CrashPoint, KillsAtTheNthPassOnly) {
  // The third pass of file.after_rename kills; passes of other points, and the first two, do not.
  int passes_before_kill = 0;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const int status = in_child("file.after_rename:3", [&] {
    for (int i = 0; i < 5; ++i) {
      crash_point("file.before_rename");
      crash_point("file.after_rename");
      const char pass = 'x';
      (void)!::write(pipe_fds[1], &pass, 1);
    }
  });
  ::close(pipe_fds[1]);
  char buffer[16];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) passes_before_kill += int(n);
  ::close(pipe_fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_EQ(passes_before_kill, 2);
}

TEST(CrashPoint, UnsetOrOtherPointNeverKills) {
  const int status = in_child("symlink.after_rename", [] {
    for (int i = 0; i < 100; ++i) crash_point("file.after_rename");
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(CrashPoint, MalformedValueFailsAtCheck) {
  const int status = in_child("file.after_rename:zero", [] {});
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "check_crash_at() must throw Error";
}

TEST(CrashPoint, ArmedUnknownPointIsAnError) {
  // A point a caller passes must be listed, or a test naming it could never crash there.
  const int status = in_child("file.after_rename", [] { crash_point("no.such.point"); });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
}

}  // namespace
}  // namespace agora
