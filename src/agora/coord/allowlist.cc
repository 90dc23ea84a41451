#include "agora/coord/allowlist.h"

#include <fmt/format.h>

#include <sstream>
#include <string>

#include "agora/core/error.h"
#include "agora/core/file.h"

namespace agora::coord {

std::set<net::PublicKey> read_allowlist(const std::filesystem::path& path) {
  std::istringstream in(read_file(path));
  std::set<net::PublicKey> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    keys.insert(net::key_from_hex(line.substr(first, last - first + 1),
                                  fmt::format("{} line {}", path.string(), number)));
  }
  if (keys.empty()) {
    fail(
        "allowlist {} holds no key; list one 64-hex public key per line (agora keygen prints "
        "them), or set network.allowlist = \"\" for an open run",
        path.string());
  }
  return keys;
}

net::Admission admission_from_allowlist(const std::filesystem::path& path) {
  net::Admission admission;
  if (path.empty()) return admission;
  admission.open = false;
  for (const auto& key : read_allowlist(path)) admission.curve_keys.insert(net::curve_public_of(key));
  return admission;
}

}  // namespace agora::coord
