#include "agora/core/hash.h"

#include <sodium.h>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"

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
  return load_le64(blake2b256(bytes).data());
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

}  // namespace agora
