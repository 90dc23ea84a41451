#include "agora/rl/seeded_draw.h"

#include <string>

#include "agora/core/hash.h"
#include "agora/core/little_endian.h"

namespace agora {

uint64_t slot_seed(std::string_view run_id, uint64_t problem_id, uint32_t sample) {
  std::string bytes = "agora/rl-slot/v1";
  uint8_t word[8];
  store_le64(run_id.size(), word);
  bytes.append(reinterpret_cast<const char*>(word), 8);
  bytes.append(run_id);
  store_le64(problem_id, word);
  bytes.append(reinterpret_cast<const char*>(word), 8);
  store_le32(sample, word);
  bytes.append(reinterpret_cast<const char*>(word), 4);
  return stable_hash64(bytes);
}

double slot_uniform(uint64_t seed, uint32_t position) {
  // splitmix64's output for state seed + (position + 1) * gamma (Steele, Lea and Flood 2014).
  uint64_t z = seed + (static_cast<uint64_t>(position) + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace agora
