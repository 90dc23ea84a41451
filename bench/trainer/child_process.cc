#include "child_process.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/subprocess.h"
#include "bench_options.h"

namespace agora::bench {

using nlohmann::json;

Child run_child(const std::vector<std::string>& argv, const std::string& what,
                const std::vector<std::string>& extra_environment) {
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kPipe;
  options.environment = extra_environment;
  const auto start = std::chrono::steady_clock::now();
  Subprocess process = Subprocess::start(argv, options);
  const std::string out = process.read_all_stdout();
  const ExitStatus exit = process.wait();
  Child child;
  child.seconds = seconds_since(start);
  if (!exit.success()) {
    agora::fail("{} failed ({}; its stderr is above): {}", what, exit.describe(),
                process.command());
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
  child.peak_rss_mb = static_cast<double>(exit.peak_rss_kib) * 1024.0 / 1e6;  // KiB
  return child;
}

double anonymous_rss_mb() {
  std::istringstream status(agora::read_file("/proc/self/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stod(line.substr(8)) * 1024.0 / 1e6;  // kB
  }
  return NAN;
}

std::vector<std::string> command_line(std::vector<std::string> program, const Flags& flags) {
  for (const auto& [flag, value] : flags) {
    program.push_back(flag);
    program.push_back(value);
  }
  return program;
}

}  // namespace agora::bench
