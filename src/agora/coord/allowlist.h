// The allowlist file of a closed run: which keys may join (network.allowlist).
#pragma once

#include <filesystem>
#include <set>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"

namespace agora::coord {

// Reads an allowlist file: one 64-hex public key per line; '#' starts a comment. Throws Error
// naming the file and line of a bad key, and when the file holds no key at all.
std::set<net::PublicKey> read_allowlist(const std::filesystem::path& path);

// Who a server admits: anyone with a key for an empty path, else the file's keys only (the
// curve25519 forms the CURVE handshake sees). Throws as read_allowlist does.
net::Admission admission_from_allowlist(const std::filesystem::path& path);

}  // namespace agora::coord
