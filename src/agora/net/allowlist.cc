#include "agora/net/allowlist.h"

#include <fmt/format.h>

#include <sstream>
#include <string>

#include "agora/core/error.h"
#include "agora/core/file.h"

namespace agora::net {

std::set<PublicKey> read_allowlist(const std::filesystem::path& path) {
  std::istringstream in(read_file(path));
  std::set<PublicKey> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    keys.insert(key_from_hex(line.substr(first, last - first + 1),
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

Admission admission_of(const std::set<PublicKey>& keys) {
  Admission admission;
  admission.open = false;
  for (const auto& key : keys) admission.curve_keys.insert(curve_public_of(key));
  return admission;
}

Admission admission_from_allowlist(const std::filesystem::path& path) {
  if (path.empty()) return Admission{};
  return admission_of(read_allowlist(path));
}

std::string describe(const Admission& admission) {
  if (admission.open) return "open to any key";
  return fmt::format("{} allowed key{}", admission.curve_keys.size(),
                     admission.curve_keys.size() == 1 ? "" : "s");
}

}  // namespace agora::net
