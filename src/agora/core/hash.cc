#include "agora/core/hash.h"

#include <sodium.h>

#include "agora/core/error.h"

namespace agora {
namespace {

void initialise_sodium() {
  // sodium_init picks the fastest implementation for this CPU; it is idempotent and thread-safe.
  static const bool initialised = sodium_init() >= 0;
  if (!initialised) fail("libsodium failed to initialise");
}

}  // namespace

std::array<uint8_t, 32> blake2b256(std::string_view bytes) {
  initialise_sodium();
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  return out;
}

std::string blake2b256_bytes(std::string_view bytes) {
  const auto digest = blake2b256(bytes);
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

uint64_t stable_hash64(std::string_view bytes) {
  const auto digest = blake2b256(bytes);
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | digest[i];
  return value;
}

}  // namespace agora

namespace agora {

struct Blake2bHasher::State {
  crypto_generichash_state sodium;
};

Blake2bHasher::Blake2bHasher() : state_(std::make_unique<State>()) {
  initialise_sodium();
  crypto_generichash_init(&state_->sodium, nullptr, 0, 32);
}

Blake2bHasher::~Blake2bHasher() = default;

void Blake2bHasher::update(std::string_view bytes) {
  crypto_generichash_update(&state_->sodium, reinterpret_cast<const unsigned char*>(bytes.data()),
                            bytes.size());
}

std::array<uint8_t, 32> Blake2bHasher::finish() {
  std::array<uint8_t, 32> out{};
  crypto_generichash_final(&state_->sodium, out.data(), out.size());
  return out;
}

std::string to_hex(const std::array<uint8_t, 32>& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t byte : digest) {
    out += kDigits[byte >> 4];
    out += kDigits[byte & 15];
  }
  return out;
}

}  // namespace agora
