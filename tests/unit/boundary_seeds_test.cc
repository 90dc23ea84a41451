// The boundary fuzz target's hand-made seeds (tests/fuzz/corpus/boundary_fuzz/) are what seeds()
// encodes: CommittedSeedsMatchTheGenerator checks them. After a deliberate format change, rewrite
// them with AGORA_WRITE_BOUNDARY_SEEDS=1 build/tests/boundary_seeds_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hex.h"
#include "agora/pipeline/boundary_codec.h"
#include "boundary_test_support.h"

namespace agora {
namespace {

using namespace boundary_test;

// The hand-made seeds of tests/fuzz/corpus/boundary_fuzz/: one message per codec and direction
// with values exact in every format (so the bytes do not depend on a random number generator).
std::vector<std::pair<std::string, std::string>> seeds() {
  struct Seed {
    const char* name;
    BoundaryHeader header;
  };
  const auto fwd = BoundaryDirection::kForward;
  const auto bwd = BoundaryDirection::kBackward;
  const Seed list[] = {
      {"f32_forward", header(BoundaryCodec::kF32, fwd, 3, 4)},
      {"bf16_backward", header(BoundaryCodec::kBF16, bwd, 2, 5)},
      {"int8_forward_short_last_block", header(BoundaryCodec::kInt8, fwd, 3, 7, 8)},
      {"int8_backward_one_value_blocks", header(BoundaryCodec::kInt8, bwd, 2, 2, 1)},
      {"subspace_forward", header(BoundaryCodec::kSubspace, fwd, 3, 2)},
      {"subspace_backward", header(BoundaryCodec::kSubspace, bwd, 2, 3)},
      {"columns_forward", header(BoundaryCodec::kColumns, fwd, 3, 2, 6)},
  };
  std::vector<std::pair<std::string, std::string>> out;
  for (const Seed& s : list) {
    const size_t n = size_t{s.header.rows} * s.header.width;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(static_cast<int>(i * 37 % 101) - 50) / 16;
    // An all-zero block for the int8 seed with blocks of 8.
    if (s.header.block == 8) std::fill(v.begin() + 8, v.begin() + 16, 0.0f);
    out.emplace_back(s.name,
                     encode_boundary(s.header, v, token_ids(s.header), column_ids(s.header)));
  }
  return out;
}

TEST(BoundarySeeds, CommittedSeedsMatchTheGenerator) {
  const std::filesystem::path dir =
      std::filesystem::path(AGORA_SOURCE_DIR) / "tests/fuzz/corpus/boundary_fuzz";
  const bool write = std::getenv("AGORA_WRITE_BOUNDARY_SEEDS") != nullptr;
  if (write) std::filesystem::create_directories(dir);
  for (const auto& [name, bytes] : seeds()) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(decode_boundary(bytes));
    if (write) {
      std::ofstream(dir / name, std::ios::binary) << bytes;
    }
    EXPECT_EQ(hex_encode(read_file(dir / name)), hex_encode(bytes));
  }
  // Inputs a fuzz campaign kept (named by their SHA-1) are any bytes: each is refused with an
  // Error or decodes.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    try {
      decode_boundary(read_file(entry.path()));
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace agora
