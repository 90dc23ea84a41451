// Fuzzes decode_boundary: any bytes must be rejected with an Error or accepted as a message whose
// promises hold.
//
// An accepted message has boundary_encoded_size(header) == the input's size, finite values only,
// tokens exactly for subspace forward, and for columns width increasing indices below block. The
// writer must accept whatever the reader accepted, and re-encoding must keep what the round trip
// promises: f32, bf16, subspace and columns are canonical
// (the bytes come back exactly); int8 is not (a forged block may use a larger scale than its
// codes need), so there the re-encoded message must decode to the same header, and values within
// half of its block's new scale (up to the float rounding of q * scale).
//
// Seeds: tests/fuzz/corpus/boundary_fuzz/, written by tests/unit/boundary_seeds_test.cc.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"
#include "agora/pipeline/boundary_codec.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

// `again` is the int8 encoding of `first.values`; `second` its decoding.
void check_int8(const agora::BoundaryMessage& first, const std::string& again,
                const agora::BoundaryMessage& second) {
  const agora::BoundaryHeader& h = first.header;
  const size_t n = first.values.size();
  check(second.values.size() == n);
  size_t offset = agora::kBoundaryHeaderBytes;
  for (size_t begin = 0; begin < n; begin += h.block) {
    const size_t len = std::min<size_t>(h.block, n - begin);
    check(offset + 4 + len <= again.size());
    const double scale = std::bit_cast<float>(
        agora::load_le32(reinterpret_cast<const uint8_t*>(again.data()) + offset));
    for (size_t i = begin; i < begin + len; ++i) {
      const double rounding = std::fabs(second.values[i]) * 0x1p-24 + 0x1p-150;
      check(std::fabs(static_cast<double>(second.values[i]) - first.values[i]) <=
            scale / 2 + rounding);
    }
    offset += 4 + len;
  }
  check(offset == again.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  agora::BoundaryMessage message;
  try {
    message = agora::decode_boundary(input);
  } catch (const agora::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }

  const agora::BoundaryHeader& h = message.header;
  const bool tokens = h.codec == agora::BoundaryCodec::kSubspace &&
                      h.direction == agora::BoundaryDirection::kForward;
  check(message.values.size() == uint64_t{h.rows} * h.width);
  check(message.tokens.size() == (tokens ? h.rows : 0));
  const bool columns = h.codec == agora::BoundaryCodec::kColumns;
  check(message.columns.size() == (columns ? h.width : 0));
  for (size_t c = 0; c < message.columns.size(); ++c) {
    check(message.columns[c] < h.block && (c == 0 || message.columns[c] > message.columns[c - 1]));
  }
  for (const float v : message.values) check(std::isfinite(v));

  std::string again;
  try {
    check(agora::boundary_encoded_size(h) == size);
    again = agora::encode_boundary(h, message.values, message.tokens, message.columns);
  } catch (const agora::Error&) {
    std::abort();  // the writer refused what the reader accepted
  }
  check(again.size() == size);

  const agora::BoundaryMessage reread = agora::decode_boundary(again);
  check(reread.header == h);
  check(reread.tokens == message.tokens);
  check(reread.columns == message.columns);
  if (h.codec == agora::BoundaryCodec::kInt8) {
    check_int8(message, again, reread);
  } else {
    check(again == input);
    check(same_bits(reread.values, message.values));
  }
  return 0;
}
