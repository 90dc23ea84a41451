// Child processes: start a program with its output routed where the caller wants it, wait for it
// (with or without a deadline), stop it. `agora demo` starts its coordinator and peers this way,
// and the benchmarks their workers and Python references.
//
// Promises:
// - argv[0] is a path to the program; PATH is not searched.
// - A program that cannot be started (missing, not executable) makes start() throw Error naming
//   the command and the reason; no child is left behind.
// - Between fork and exec the child calls only async-signal-safe functions, and every descriptor
//   this file opens is close-on-exec, so a child inherits stdin, stdout and stderr (routed as
//   asked) and nothing else of ours.
// - The child is forked, not posix_spawn()ed: a forked child's ru_maxrss counts the parent's
//   resident memory it holds until exec, and bench_trainer's peak-memory figures are stated
//   that way.
// - A Subprocess owns its child: destroying one whose child still runs kills it (SIGKILL) and
//   reaps it, so no child outlives its owner by accident. Call stop() for a graceful end.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace agora {

// Where a child's stdout or stderr goes.
enum class ChildOutput {
  kInherit,  // the parent's
  kPipe,     // a pipe the parent reads (stdout only): Subprocess::stdout_fd(), read_all_stdout()
  kLog,      // appended to SubprocessOptions::log
  kStderr,   // the parent's stderr (stdout only), which keeps the parent's stdout clean
};

struct SubprocessOptions {
  ChildOutput stdout_to = ChildOutput::kInherit;
  ChildOutput stderr_to = ChildOutput::kInherit;
  std::filesystem::path log;  // for kLog; created if missing, mode 0644
  // "NAME=value" entries that replace or add to this process's environment.
  std::vector<std::string> environment;
  // The child leads a process group of its own, so a Ctrl-C at the terminal reaches only the
  // parent, which can then stop its children in order.
  bool own_process_group = false;
};

struct ExitStatus {
  int wait_status = 0;    // as waitpid() reports it
  long peak_rss_kib = 0;  // the child's ru_maxrss

  // Exited with status 0.
  bool success() const;
  // "exit status 3" or "signal 9", for messages.
  std::string describe() const;
};

class Subprocess {
 public:
  // Starts argv[0] with arguments argv. Throws Error naming the command when it cannot start.
  static Subprocess start(const std::vector<std::string>& argv,
                          const SubprocessOptions& options = {});
  ~Subprocess();

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // -1 once the child has been reaped.
  pid_t pid() const { return pid_; }
  // The argv joined by spaces, for messages.
  const std::string& command() const { return command_; }
  // The read end of the child's stdout with ChildOutput::kPipe (else -1), for the caller to poll.
  int stdout_fd() const { return stdout_fd_; }
  // Everything the child writes to its stdout pipe until it closes it; closes our end.
  std::string read_all_stdout();

  // Waits up to `seconds` (at least one look) for the child to exit; its status when it did.
  std::optional<ExitStatus> wait_for(double seconds);
  // Waits as long as it takes.
  ExitStatus wait();
  // SIGTERM, then SIGKILL if it has not exited after `grace_seconds`; reaps it.
  void stop(double grace_seconds);

 private:
  Subprocess() = default;
  void close_stdout() noexcept;

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string command_;
};

// This program's own path (/proc/self/exe), to start it again as a worker or a peer.
std::filesystem::path this_executable();

}  // namespace agora
