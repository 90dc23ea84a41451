#include "agora/core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string_view>
#include <thread>
#include <utility>

#include "agora/core/error.h"

extern char** environ;

namespace agora {
namespace fs = std::filesystem;
namespace {

// How often wait_for() looks whether the child has exited.
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// How long a killed child may take to be reaped before we stop waiting for it.
constexpr double kKillSeconds = 5;

std::string_view name_of(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

// Ours, with `overrides` ("NAME=value") replacing or adding entries; the strings must outlive
// the exec.
std::vector<char*> environment_with(const std::vector<std::string>& overrides) {
  std::vector<char*> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const bool overridden =
        std::any_of(overrides.begin(), overrides.end(),
                    [&](const std::string& o) { return name_of(o) == name_of(*e); });
    if (!overridden) out.push_back(*e);
  }
  for (const std::string& o : overrides) out.push_back(const_cast<char*>(o.c_str()));
  out.push_back(nullptr);
  return out;
}

// Closes a descriptor on every way out of start().
class FdGuard {
 public:
  FdGuard() = default;
  ~FdGuard() { reset(); }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int* put() { return &fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

// waitpid() with the child's resource usage; EINTR is retried. 0 while the child runs (only
// with WNOHANG).
pid_t wait_with_usage(pid_t pid, int options, ExitStatus* status) {
  int raw = 0;
  struct rusage usage {};
  pid_t r;
  do {
    r = ::wait4(pid, &raw, options, &usage);
  } while (r < 0 && errno == EINTR);
  if (r < 0) fail("cannot wait for process {}: {}", pid, std::strerror(errno));
  if (r == pid) *status = {raw, usage.ru_maxrss};
  return r;
}

}  // namespace

bool ExitStatus::success() const {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

std::string ExitStatus::describe() const {
  return WIFEXITED(wait_status) ? fmt::format("exit status {}", WEXITSTATUS(wait_status))
                                : fmt::format("signal {}", WTERMSIG(wait_status));
}

Subprocess Subprocess::start(const std::vector<std::string>& argv,
                             const SubprocessOptions& options) {
  if (argv.empty()) fail("cannot start a process without a program (argv is empty)");
  if (options.stderr_to == ChildOutput::kPipe || options.stderr_to == ChildOutput::kStderr) {
    fail("a child's stderr can be inherited or sent to a log, not piped or sent to stderr");
  }
  Subprocess child;
  for (const std::string& a : argv) child.command_ += (child.command_.empty() ? "" : " ") + a;

  // Everything the child needs is made here, before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::vector<char*> environment =
      options.environment.empty() ? std::vector<char*>() : environment_with(options.environment);
  char* const* envp = options.environment.empty() ? environ : environment.data();

  FdGuard log, stdout_read, stdout_write, exec_error_read, exec_error_write;
  if (options.stdout_to == ChildOutput::kLog || options.stderr_to == ChildOutput::kLog) {
    *log.put() = ::open(options.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log.get() < 0) fail("cannot write {}: {}", options.log.string(), std::strerror(errno));
  }
  if (options.stdout_to == ChildOutput::kPipe) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) fail("cannot create a pipe: {}", std::strerror(errno));
    *stdout_read.put() = fds[0];
    *stdout_write.put() = fds[1];
  }
  // The child reports a failed exec through this pipe; a successful exec closes it empty.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("cannot create a pipe: {}", std::strerror(errno));
  *exec_error_read.put() = fds[0];
  *exec_error_write.put() = fds[1];

  // What we printed before the child starts comes before what it prints.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot start {}: {}", child.command_, std::strerror(errno));
  if (pid == 0) {
    if (options.own_process_group) ::setpgid(0, 0);
    // stdout first: kStderr means the parent's stderr, before any redirection of the child's.
    switch (options.stdout_to) {
      case ChildOutput::kPipe:
        ::dup2(stdout_write.get(), STDOUT_FILENO);
        break;
      case ChildOutput::kLog:
        ::dup2(log.get(), STDOUT_FILENO);
        break;
      case ChildOutput::kStderr:
        ::dup2(STDERR_FILENO, STDOUT_FILENO);
        break;
      case ChildOutput::kInherit:
        break;
    }
    if (options.stderr_to == ChildOutput::kLog) ::dup2(log.get(), STDERR_FILENO);
    ::execve(args[0], args.data(), envp);
    const int error = errno;
    [[maybe_unused]] const ssize_t ignored = ::write(exec_error_write.get(), &error, sizeof(error));
    ::_exit(127);
  }
  child.pid_ = pid;
  exec_error_write.reset();
  stdout_write.reset();
  int exec_error = 0;
  ssize_t n;
  do {
    n = ::read(exec_error_read.get(), &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  if (n == sizeof(exec_error)) {
    child.wait();
    fail("cannot run {}: {}", child.command_, std::strerror(exec_error));
  }
  child.stdout_fd_ = stdout_read.release();
  return child;
}

Subprocess::~Subprocess() {
  close_stdout();
  if (pid_ < 0) return;
  ::kill(pid_, SIGKILL);
  try {
    wait_for(kKillSeconds);
  } catch (const Error&) {
    // Nothing more a destructor can do; the child is killed either way.
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      command_(std::move(other.command_)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Subprocess old(std::move(*this));  // its destructor ends what this held
    pid_ = std::exchange(other.pid_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    command_ = std::move(other.command_);
  }
  return *this;
}

std::string Subprocess::read_all_stdout() {
  if (stdout_fd_ < 0) fail("{}: its stdout is not a pipe, or was read already", command_);
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(stdout_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      out.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close_stdout();
  return out;
}

std::optional<ExitStatus> Subprocess::wait_for(double seconds) {
  if (pid_ < 0) fail("{}: waited for twice", command_);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  ExitStatus status;
  while (wait_with_usage(pid_, WNOHANG, &status) == 0) {
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(kPollInterval);
  }
  pid_ = -1;
  return status;
}

ExitStatus Subprocess::wait() {
  if (pid_ < 0) fail("{}: waited for twice", command_);
  ExitStatus status;
  wait_with_usage(pid_, 0, &status);
  pid_ = -1;
  return status;
}

void Subprocess::stop(double grace_seconds) {
  if (pid_ < 0) return;
  ::kill(pid_, SIGTERM);
  if (wait_for(grace_seconds)) return;
  ::kill(pid_, SIGKILL);
  wait_for(kKillSeconds);
}

void Subprocess::close_stdout() noexcept {
  if (stdout_fd_ >= 0) ::close(std::exchange(stdout_fd_, -1));
}

fs::path this_executable() {
  std::error_code ec;
  const fs::path path = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot find this program's path (/proc/self/exe): {}", ec.message());
  return path;
}

}  // namespace agora
