#include "child_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string_view>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "bench_options.h"

namespace agora::bench {

using nlohmann::json;

Child run_child(const std::vector<std::string>& argv, const std::string& what,
                const std::vector<std::string>& extra_environment) {
  std::cout.flush();
  std::cerr.flush();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) agora::fail("pipe for {}: {}", what, std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool overridden = std::any_of(
        extra_environment.begin(), extra_environment.end(), [&](const std::string& extra) {
          return entry.substr(0, entry.find('=')) == extra.substr(0, extra.find('='));
        });
    if (!overridden) environment.push_back(*e);
  }
  for (const std::string& e : extra_environment)
    environment.push_back(const_cast<char*>(e.c_str()));
  environment.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) agora::fail("fork for {}: {}", what, std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);  // the duplicate does not inherit O_CLOEXEC
    ::execve(args[0], args.data(), environment.data());
    std::fprintf(stderr, "bench_trainer: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      out.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) agora::fail("wait4 for {}: {}", what, std::strerror(errno));
  }
  Child child;
  child.seconds = seconds_since(start);
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    agora::fail("{} failed ({}; its stderr is above): {}", what,
                WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                                  : fmt::format("signal {}", WTERMSIG(status)),
                command);
  }
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  try {
    child.output = json::parse(last);
  } catch (const json::exception& e) {
    agora::fail("{} printed no JSON result ({}); its output was:\n{}", what, e.what(), out);
  }
  child.peak_rss_mb = static_cast<double>(usage.ru_maxrss) * 1024.0 / 1e6;  // ru_maxrss is KiB
  return child;
}

double anonymous_rss_mb() {
  std::istringstream status(agora::read_file("/proc/self/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stod(line.substr(8)) * 1024.0 / 1e6;  // kB
  }
  return NAN;
}

std::string self_path() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) agora::fail("cannot find this program's path (/proc/self/exe): {}", ec.message());
  return p.string();
}

std::vector<std::string> command_line(std::vector<std::string> program, const Flags& flags) {
  for (const auto& [flag, value] : flags) {
    program.push_back(flag);
    program.push_back(value);
  }
  return program;
}

}  // namespace agora::bench
