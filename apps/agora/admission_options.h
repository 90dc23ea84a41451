// --allowlist FILE | --open: who may connect to a serving role (agora async serve, rl serve,
// swarm serve). One of the two is required, so that a server reachable from the internet is
// never open to any key because its operator left a flag out (docs/security.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "agora/net/curve_socket.h"

namespace agora::cli {

struct AdmissionOptions {
  std::string allowlist;
  bool open = false;
};

// Adds --allowlist and --open to `cmd`; `members` names who connects ("workers", "peers").
void add_admission_options(CLI::App& cmd, AdmissionOptions& options, const std::string& members);

// The admission the options say; throws Error when neither or both are given, warns on stderr
// when the server is open to any key.
net::Admission admission_of(const AdmissionOptions& options);

}  // namespace agora::cli
