// Stable hashes: the same bytes give the same value on every machine, build and run.
//
// std::hash promises none of that, so anything that must agree across peers or runs (the
// validation split, sampler keys, later payload ids) hashes through here. BLAKE2b from libsodium.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace agora {

// The first 8 bytes of BLAKE2b-256 of `bytes`, little-endian.
uint64_t stable_hash64(std::string_view bytes);

// BLAKE2b-256 of `bytes`.
std::array<uint8_t, 32> blake2b256(std::string_view bytes);
// The same 32 bytes in a std::string: how hashes travel in protobuf bytes fields and map keys.
std::string blake2b256_bytes(std::string_view bytes);

// BLAKE2b-256 over data that arrives in pieces (e.g. a model's tensors, one after another).
class Blake2bHasher {
 public:
  Blake2bHasher();
  ~Blake2bHasher();
  Blake2bHasher(const Blake2bHasher&) = delete;
  Blake2bHasher& operator=(const Blake2bHasher&) = delete;

  void update(std::string_view bytes);
  std::array<uint8_t, 32> finish();  // once

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace agora
