// Helpers shared by the boundary codec's tests (boundary_codec_test.cc, boundary_seeds_test.cc):
// headers of a fixed position, and the tokens and column indices a message of each codec carries.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "agora/pipeline/boundary_codec.h"

namespace agora::boundary_test {

inline BoundaryHeader header(BoundaryCodec codec, BoundaryDirection direction, uint32_t rows,
                             uint32_t width, uint32_t block = 0) {
  BoundaryHeader h;
  h.direction = direction;
  h.codec = codec;
  h.step = 0x0123456789abcdefULL;
  h.micro_batch = 7;
  h.stage = 2;
  h.rows = rows;
  h.width = width;
  h.block = block;
  return h;
}

inline bool carries_tokens(const BoundaryHeader& h) {
  return h.codec == BoundaryCodec::kSubspace && h.direction == BoundaryDirection::kForward;
}

inline std::vector<float> random_values(size_t n, uint32_t seed, float spread = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline std::vector<uint32_t> token_ids(const BoundaryHeader& h) {
  std::vector<uint32_t> t;
  if (!carries_tokens(h)) return t;
  for (uint32_t i = 0; i < h.rows; ++i) t.push_back(i * 2654435761u);  // any u32 is accepted
  return t;
}

// For columns messages: `width` increasing indices spread over the full width `block`.
inline std::vector<uint32_t> column_ids(const BoundaryHeader& h) {
  std::vector<uint32_t> c;
  if (h.codec != BoundaryCodec::kColumns) return c;
  for (uint32_t i = 0; i < h.width; ++i) {
    c.push_back(static_cast<uint32_t>(uint64_t{i} * h.block / h.width));
  }
  return c;
}

}  // namespace agora::boundary_test
