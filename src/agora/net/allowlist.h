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

// Who a server admits: anyone with a key for an empty path, else the file's keys only (the
// curve25519 forms the CURVE handshake sees). Throws as read_allowlist does.
Admission admission_from_allowlist(const std::filesystem::path& path);
Admission admission_of(const std::set<PublicKey>& keys);

// "open to any key" or "N allowed keys": what a server logs when it starts, so that an open
// server is never open by accident unnoticed.
std::string describe(const Admission& admission);

}  // namespace agora::net
