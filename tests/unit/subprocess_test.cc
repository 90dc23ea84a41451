// core/subprocess.h: starting programs with their output routed, their environment, exit
// statuses, deadlines, stopping, and a child never outliving its owner.
#include "agora/core/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "test_support.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class SubprocessTest : public agora::testing::TempDirTest {};

Subprocess shell(const std::string& script, SubprocessOptions options = {}) {
  return Subprocess::start({"/bin/sh", "-c", script}, options);
}

SubprocessOptions piped() {
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kPipe;
  return options;
}

TEST_F(SubprocessTest, CapturesStdoutAndTheExitStatus) {
  Subprocess child = shell("echo hello; exit 3", piped());
  EXPECT_EQ(child.command(), "/bin/sh -c echo hello; exit 3");
  EXPECT_EQ(child.read_all_stdout(), "hello\n");
  const ExitStatus status = child.wait();
  EXPECT_FALSE(status.success());
  EXPECT_EQ(status.describe(), "exit status 3");
  EXPECT_GT(status.peak_rss_kib, 0);
  EXPECT_EQ(child.pid(), -1);
  EXPECT_TRUE(shell("true").wait().success());
}

TEST_F(SubprocessTest, EnvironmentEntriesReplaceAndAdd) {
  ASSERT_EQ(::setenv("AGORA_SUBPROCESS_TEST_OLD", "ours", 1), 0);
  SubprocessOptions options = piped();
  options.environment = {"AGORA_SUBPROCESS_TEST_OLD=theirs", "AGORA_SUBPROCESS_TEST_NEW=new"};
  Subprocess child = shell(
      "echo $AGORA_SUBPROCESS_TEST_OLD $AGORA_SUBPROCESS_TEST_NEW; echo ${HOME:+home}", options);
  EXPECT_EQ(child.read_all_stdout(),
            "theirs new\n" + std::string(::getenv("HOME") ? "home\n" : "\n"));
  EXPECT_TRUE(child.wait().success());
}

TEST_F(SubprocessTest, LogGetsStdoutAndStderrAppended) {
  const fs::path log = dir_ / "child.log";
  write_file_atomic(log, "earlier\n");
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kLog;
  options.stderr_to = ChildOutput::kLog;
  options.log = log;
  EXPECT_TRUE(shell("echo out; echo err >&2", options).wait().success());
  EXPECT_EQ(read_file(log), "earlier\nout\nerr\n");
}

TEST_F(SubprocessTest, StdoutCanGoToOurStderr) {
  const fs::path captured = dir_ / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  FILE* file = std::fopen(captured.c_str(), "w");
  ASSERT_NE(file, nullptr);
  ::dup2(::fileno(file), STDERR_FILENO);
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kStderr;
  const bool ok = shell("echo to-stderr", options).wait().success();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::fclose(file);
  EXPECT_TRUE(ok);
  EXPECT_EQ(read_file(captured), "to-stderr\n");
}

TEST_F(SubprocessTest, AProgramThatCannotRunIsAnError) {
  EXPECT_ERROR_WITH(Subprocess::start({(dir_ / "no-such-program").string(), "--flag"}),
                    "cannot run " + (dir_ / "no-such-program").string() + " --flag",
                    "No such file");
  EXPECT_ERROR_WITH(Subprocess::start({}), "argv is empty");
}

TEST_F(SubprocessTest, WaitForHasADeadlineAndStopEndsTheChild) {
  Subprocess child = shell("exec sleep 30");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(child.wait_for(0.2).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  child.stop(5);
  EXPECT_EQ(child.pid(), -1);
  child.stop(5);  // stopping a reaped child does nothing

  Subprocess quick = shell("exit 0");
  const std::optional<ExitStatus> status = quick.wait_for(10);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success());
}

TEST_F(SubprocessTest, ASignalIsDescribed) {
  Subprocess child = shell("kill -9 $$");
  EXPECT_EQ(child.wait().describe(), "signal 9");
}

TEST_F(SubprocessTest, DestroyingARunningChildKillsIt) {
  pid_t pid = -1;
  {
    Subprocess child = shell("exec sleep 30");
    pid = child.pid();
    ASSERT_GT(pid, 0);
  }
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(SubprocessTest, ThisExecutableIsThisTest) {
  const fs::path self = this_executable();
  EXPECT_TRUE(self.is_absolute());
  EXPECT_EQ(self.filename(), "subprocess_test");
}

}  // namespace
}  // namespace agora
