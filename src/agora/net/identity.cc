#include "agora/net/identity.h"

#include <sodium.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hex.h"
#include "agora/core/little_endian.h"

namespace agora::net {
namespace fs = std::filesystem;
namespace {

void initialise_sodium() {
  static const bool initialised = sodium_init() >= 0;
  if (!initialised) fail("libsodium failed to initialise");
}

const unsigned char* bytes_of(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

Identity Identity::generate() {
  initialise_sodium();
  Identity id;
  id.public_key_.resize(crypto_sign_PUBLICKEYBYTES);
  id.secret_.resize(crypto_sign_SECRETKEYBYTES);
  crypto_sign_keypair(reinterpret_cast<unsigned char*>(id.public_key_.data()),
                      reinterpret_cast<unsigned char*>(id.secret_.data()));
  return id;
}

Identity Identity::from_seed(std::string_view seed) {
  initialise_sodium();
  if (seed.size() != crypto_sign_SEEDBYTES) {
    fail("an identity seed has {} bytes; expected {}", seed.size(), crypto_sign_SEEDBYTES);
  }
  Identity id;
  id.public_key_.resize(crypto_sign_PUBLICKEYBYTES);
  id.secret_.resize(crypto_sign_SECRETKEYBYTES);
  crypto_sign_seed_keypair(reinterpret_cast<unsigned char*>(id.public_key_.data()),
                           reinterpret_cast<unsigned char*>(id.secret_.data()), bytes_of(seed));
  return id;
}

Identity Identity::load(const fs::path& path) {
  initialise_sodium();
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    fail("key file {}: {} (make one with 'agora keygen --out {}')", path.string(),
         std::strerror(errno), path.string());
  }
  if ((info.st_mode & 077) != 0) {
    fail("key file {} may be read by other users (mode {:o}); run 'chmod 600 {}'", path.string(),
         info.st_mode & 0777, path.string());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("key file {} is not JSON: {}", path.string(), e.what());
  }
  if (!j.is_object() || j.value("kind", "") != "agora-ed25519" || !j["public"].is_string() ||
      !j["seed"].is_string()) {
    fail(
        "key file {} is not an agora identity (expected kind \"agora-ed25519\" with \"public\" "
        "and \"seed\" strings)",
        path.string());
  }
  const std::string seed = hex_decode(j["seed"].get<std::string>(), crypto_sign_SEEDBYTES,
                                      "key file " + path.string() + ": seed");
  const PublicKey expected =
      key_from_hex(j["public"].get<std::string>(), "key file " + path.string() + ": public key");
  Identity id = from_seed(seed);
  if (id.public_key_ != expected) {
    fail(
        "key file {}: the public key does not belong to the seed (the file was edited or is "
        "corrupt)",
        path.string());
  }
  return id;
}

void Identity::save(const fs::path& path, bool overwrite) const {
  if (!overwrite && fs::exists(path)) {
    fail("{} exists; refusing to replace an identity (pass --force to overwrite it)",
         path.string());
  }
  const std::string seed(secret_.data(), crypto_sign_SEEDBYTES);
  const nlohmann::json j = {
      {"kind", "agora-ed25519"}, {"public", hex_encode(public_key_)}, {"seed", hex_encode(seed)}};
  write_file_atomic(path, j.dump(2) + "\n", 0600);
}

std::string Identity::sign(std::string_view message) const {
  std::string signature(crypto_sign_BYTES, '\0');
  crypto_sign_detached(reinterpret_cast<unsigned char*>(signature.data()), nullptr,
                       bytes_of(message), message.size(), bytes_of(secret_));
  return signature;
}

std::string Identity::curve_public() const {
  return curve_public_of(public_key_);
}

std::string Identity::curve_secret() const {
  std::string out(crypto_scalarmult_curve25519_BYTES, '\0');
  crypto_sign_ed25519_sk_to_curve25519(reinterpret_cast<unsigned char*>(out.data()),
                                       bytes_of(secret_));
  return out;
}

bool verify_signature(const PublicKey& key, std::string_view message, std::string_view signature) {
  initialise_sodium();
  if (key.size() != crypto_sign_PUBLICKEYBYTES || signature.size() != crypto_sign_BYTES) {
    return false;
  }
  return crypto_sign_verify_detached(bytes_of(signature), bytes_of(message), message.size(),
                                     bytes_of(key)) == 0;
}

std::string curve_public_of(const PublicKey& key) {
  initialise_sodium();
  std::string out(crypto_scalarmult_curve25519_BYTES, '\0');
  if (key.size() != crypto_sign_PUBLICKEYBYTES ||
      crypto_sign_ed25519_pk_to_curve25519(reinterpret_cast<unsigned char*>(out.data()),
                                           bytes_of(key)) != 0) {
    fail("public key {} is not a valid ed25519 key", hex_encode(key));
  }
  return out;
}

std::string key_to_hex(const PublicKey& key) {
  return hex_encode(key);
}

PublicKey key_from_hex(std::string_view text, std::string_view what) {
  return hex_decode(text, kKeyBytes, what);
}

std::string short_key(const PublicKey& key) {
  return short_hex(key);
}

std::string commit_signing_bytes(std::string_view run_id, uint64_t step,
                                 std::string_view payload_hash) {
  std::string out = "agora/commit/v1";
  append_le(out, run_id.size(), 2);
  out.append(run_id);
  append_le(out, step, 8);
  out.append(payload_hash);
  return out;
}

std::string random_bytes(size_t n) {
  initialise_sodium();
  std::string out(n, '\0');
  randombytes_buf(out.data(), n);
  return out;
}

std::string strategy_signing_bytes(std::string_view run_id, uint64_t step,
                                   std::string_view payload_hash, uint64_t trained_from,
                                   std::string_view before, std::string_view after) {
  std::string out = "agora/strategy/v1";
  append_le(out, run_id.size(), 2);
  out.append(run_id);
  append_le(out, step, 8);
  out.append(payload_hash);
  append_le(out, trained_from, 8);
  out.append(before);
  out.append(after);
  return out;
}

}  // namespace agora::net
