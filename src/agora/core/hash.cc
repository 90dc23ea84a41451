#include "agora/core/hash.h"

#include <sodium.h>

#include "agora/core/error.h"

namespace agora {

std::array<uint8_t, 32> blake2b256(std::string_view bytes) {
  // sodium_init picks the fastest implementation for this CPU; it is idempotent and thread-safe.
  static const bool initialised = sodium_init() >= 0;
  if (!initialised) fail("libsodium failed to initialise");
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  return out;
}

uint64_t stable_hash64(std::string_view bytes) {
  const auto digest = blake2b256(bytes);
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | digest[i];
  return value;
}

}  // namespace agora
