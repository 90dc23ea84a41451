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
        "them), or open the run to any key instead (--open, network.open = true)",
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

Admission admission_for(const std::filesystem::path& allowlist, bool open, AdmissionNames names,
                        std::set<PublicKey>* keys) {
  if (open && !allowlist.empty()) {
    fail("both {} ({}) and {} are set; choose one: {} admits the keys the file lists, {} any key",
         names.allowlist, allowlist.string(), names.open, names.allowlist, names.open);
  }
  if (!open && allowlist.empty()) {
    fail(
        "who may connect is not said: set {} to a file of the keys to admit (one 64-hex public "
        "key per line, as agora keygen prints them), or {} to admit any key",
        names.allowlist, names.open);
  }
  if (open) return Admission{};
  std::set<PublicKey> read = read_allowlist(allowlist);
  Admission admission = admission_of(read);
  if (keys) *keys = std::move(read);
  return admission;
}

std::string describe(const Admission& admission) {
  if (admission.open) return "open to any key";
  return fmt::format("{} allowed key{}", admission.curve_keys.size(),
                     admission.curve_keys.size() == 1 ? "" : "s");
}

}  // namespace agora::net
