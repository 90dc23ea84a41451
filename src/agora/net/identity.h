// Identity: who a peer or coordinator is on the network, and what it signs.
//
// An identity is an ed25519 key pair (libsodium). The public key (32 bytes; 64 hex characters
// when a person copies it) names a member everywhere: allowlists, commitments, logs. The same
// key pair converts to the curve25519 pair that ZeroMQ's CURVE handshake uses, so one file gives
// both the signing key and the transport key, and a CURVE-authenticated connection proves which
// ed25519 key is on the other end.
//
// The key file (written by `agora keygen`, mode 0600) is JSON:
//   {"kind": "agora-ed25519", "public": "<64 hex>", "seed": "<64 hex>"}
// Loading checks the kind, the lengths, that the public key matches the seed, and refuses a file
// that group or others may read.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace agora::net {

inline constexpr size_t kKeyBytes = 32;
inline constexpr size_t kSignatureBytes = 64;

// A raw 32-byte ed25519 public key held in a std::string (usable as a map key and a protobuf
// bytes field).
using PublicKey = std::string;

class Identity {
 public:
  // A fresh random identity.
  static Identity generate();
  // The identity of a 32-byte seed (tests and fuzzing need the same keys every run); throws
  // Error for another length.
  static Identity from_seed(std::string_view seed);
  // Reads a key file; throws Error naming the file and what is wrong with it.
  static Identity load(const std::filesystem::path& path);
  // Writes the key file with mode 0600; refuses to replace an existing file unless `overwrite`.
  void save(const std::filesystem::path& path, bool overwrite = false) const;

  const PublicKey& public_key() const { return public_key_; }
  // ed25519 detached signature (64 bytes) of `message`.
  std::string sign(std::string_view message) const;

  // The CURVE pair ZeroMQ needs (curve25519, 32 raw bytes each).
  std::string curve_public() const;
  std::string curve_secret() const;

 private:
  PublicKey public_key_;
  std::string secret_;  // libsodium's 64-byte ed25519 secret key (seed + public)
};

// True when `signature` is `key`'s ed25519 signature of `message`. False for malformed sizes.
bool verify_signature(const PublicKey& key, std::string_view message, std::string_view signature);

// The curve25519 key ZeroMQ's handshake sees for ed25519 key `key`; throws Error when `key` is
// not a valid ed25519 point.
std::string curve_public_of(const PublicKey& key);

// The key forms of core/hex.h. "ab12...": 64 lower-case hex characters.
std::string key_to_hex(const PublicKey& key);
// The inverse; throws Error naming `what` when `hex` is not 64 hex characters.
PublicKey key_from_hex(std::string_view hex, std::string_view what = "public key");
// The first 8 hex characters: enough to tell members apart in logs.
std::string short_key(const PublicKey& key);

// `n` bytes from libsodium's generator (unpredictable: seeds of spot checks).
std::string random_bytes(size_t n);

// What a commitment signs: "agora/commit/v1" | u16 len(run_id) | run_id | u64 step (LE) | hash.
std::string commit_signing_bytes(std::string_view run_id, uint64_t step,
                                 std::string_view payload_hash);
// What a strategy commitment signs (Commit.strategy_signature): "agora/strategy/v1" | u16
// len(run_id) | run_id | u64 step (LE) | payload hash | u64 trained_from (LE) | state hash
// before | state hash after.
std::string strategy_signing_bytes(std::string_view run_id, uint64_t step,
                                   std::string_view payload_hash, uint64_t trained_from,
                                   std::string_view before, std::string_view after);

}  // namespace agora::net
