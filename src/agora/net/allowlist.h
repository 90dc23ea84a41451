// The allowlist file of a closed run: which keys may connect (network.allowlist, and the
// --allowlist of every serving role). The same file format everywhere: one 64-hex ed25519 public
// key per line, '#' starts a comment.
#pragma once

#include <filesystem>
#include <set>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"

namespace agora::net {

// Reads an allowlist file: one 64-hex public key per line; '#' starts a comment. Throws Error
// naming the file and line of a bad key, and when the file holds no key at all.
std::set<PublicKey> read_allowlist(const std::filesystem::path& path);

// Who a server admits: the keys' curve25519 forms, which the CURVE handshake sees.
Admission admission_of(const std::set<PublicKey>& keys);

// The names a role gives its two admission settings, for the error that asks for one of them:
// {"--allowlist", "--open"} on the command line, {"network.allowlist", "network.open"} in a
// run config.
struct AdmissionNames {
  const char* allowlist;
  const char* open;
};

// Who a serving role admits, said explicitly: the keys of the `allowlist` file, or anyone when
// `open`. Throws Error naming both settings when neither or both are given, so that no server is
// open to the internet because its operator forgot a flag. `keys`, when given, receives the
// keys read (the file is read once: a role that also needs the keys sees what it admits).
Admission admission_for(const std::filesystem::path& allowlist, bool open, AdmissionNames names,
                        std::set<PublicKey>* keys = nullptr);

// "open to any key" or "N allowed keys": what a server logs when it starts, so that an open
// server is never open by accident unnoticed.
std::string describe(const Admission& admission);

}  // namespace agora::net
