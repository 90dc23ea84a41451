// child_process.h: running one bench_trainer measurement as a child process (core/subprocess.h)
// -- its result is the JSON it prints last on stdout, its peak memory the ru_maxrss from wait4().
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace agora::bench {

struct Child {
  nlohmann::json output;
  double peak_rss_mb = 0;  // ru_maxrss, MB = 10^6 bytes
  double seconds = 0;
};

// Runs `argv` with our environment plus `extra_environment` ("NAME=value"), its stdout
// captured (the last non-empty line must be JSON), its stderr shared with ours, and waits for
// it; throws Error when it fails.
Child run_child(const std::vector<std::string>& argv, const std::string& what,
                const std::vector<std::string>& extra_environment = {});

// This process's anonymous resident memory (RssAnon), which a forked child holds until exec.
double anonymous_rss_mb();

using Flags = std::vector<std::pair<std::string, std::string>>;

// `program` followed by each flag and its value.
std::vector<std::string> command_line(std::vector<std::string> program, const Flags& flags);

}  // namespace agora::bench
