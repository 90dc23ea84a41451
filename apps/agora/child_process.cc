#include "child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "agora/core/error.h"

namespace agora::cli {

Child spawn(const std::string& name, const std::vector<std::string>& argv,
            const std::filesystem::path& log, bool pipe_stdout) {
  int fds[2] = {-1, -1};
  if (pipe_stdout && ::pipe(fds) != 0) fail("cannot create a pipe: {}", std::strerror(errno));
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) fail("cannot write {}: {}", log.string(), std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot start {}: {}", name, std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // Ctrl-C reaches the demo, which stops its children in order
    ::dup2(log_fd, STDERR_FILENO);
    ::dup2(pipe_stdout ? fds[1] : log_fd, STDOUT_FILENO);
    if (pipe_stdout) ::close(fds[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(log_fd);
  Child child{pid, -1, name};
  if (pipe_stdout) {
    ::close(fds[1]);
    child.stdout_fd = fds[0];
  }
  return child;
}

bool wait_child(Child& child, double seconds, int* status) {
  if (child.pid < 0) return true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    int s = 0;
    const pid_t r = ::waitpid(child.pid, &s, WNOHANG);
    if (r == child.pid) {
      if (status) *status = s;
      child.pid = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void stop_child(Child& child, double grace_seconds) {
  if (child.pid < 0) return;
  ::kill(child.pid, SIGTERM);
  if (!wait_child(child, grace_seconds, nullptr)) {
    ::kill(child.pid, SIGKILL);
    wait_child(child, 5, nullptr);
  }
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail("cannot find a free port on 127.0.0.1: {}", std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace agora::cli
