// Child processes for `agora demo`: start, watch, signal and reap them.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace agora::cli {

struct Child {
  pid_t pid = -1;
  int stdout_fd = -1;  // the read end of a pipe from the child's stdout, or -1
  std::string name;
};

// Starts `argv` with stderr (and stdout, unless `pipe_stdout`) appended to `log`.
Child spawn(const std::string& name, const std::vector<std::string>& argv,
            const std::filesystem::path& log, bool pipe_stdout);

// SIGTERM, then SIGKILL after `grace_seconds`; reaps it.
void stop_child(Child& child, double grace_seconds);

// Waits up to `seconds` for the child to exit; true (and the exit status) when it did.
bool wait_child(Child& child, double seconds, int* status);

// A TCP port that was free a moment ago on 127.0.0.1.
int free_port();

}  // namespace agora::cli
