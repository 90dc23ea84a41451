// Boundary message: what crosses a pipeline stage boundary when a model is split into stages on
// different peers, as the bytes that cross the internet. Forward, a stage sends the activations
// its last layer produced for one micro-batch to the next stage; backward, the next stage sends
// the gradient of the loss with respect to those activations back. Either way the message is a
// matrix of rows x width floats, one row per token (rows = batch * time), plus, for the subspace
// codec going forward, one token id per row.
//
// Codecs (what a boundary costs is most of pipeline training's traffic, hence the choice):
//   f32       the floats as they are.
//   bf16      each float rounded to bf16 (to nearest, ties to even): half the bytes.
//   int8      blockwise 8-bit, as SWARM sends activations: the rows * width values, flattened
//             row-major, are cut into consecutive blocks of `block` values (the last one may be
//             shorter); each block has a scale = absmax / 127 (0 for an all-zero block) and codes
//             q = clamp(round(v / scale), -127, 127); a value decodes to q * scale.
//   subspace  the caller has already projected each row onto a k-dimensional subspace; the
//             message carries the k = width coefficients per row as f32 and, forward, the row's
//             token id, from which the receiver rebuilds x = E_fix[token] + U c. The codec knows
//             neither U nor the vocabulary: decoding does not range-check token ids, the caller
//             must (against its vocabulary size) before it indexes anything with them.
//   columns   a column-space sparsifier: of each row's `block` values (the full width d) only
//             the same `width` columns are sent for every row of the message, their indices
//             once (increasing), then their values as f32; the rest decode as 0 (the caller
//             scatters them: the message itself holds rows x width values). Which columns is
//             the sender's choice (boundary.h says agora's rule).
//
// Wire format, version 1, all integers little-endian, floats IEEE 754 binary32 as their bits:
//
//   header   "AGPB" | u16 version = 1 | u8 direction | u8 codec | u64 step | u32 micro_batch
//            | u32 stage | u32 rows | u32 width | u32 block                          (36 bytes)
//   body, by codec, n = rows * width:
//     f32       f32 values[n]
//     bf16      u16 values[n]                   (the high 16 bits of the bf16 value's f32 bits)
//     int8      per block b = 0 .. ceil(n / block) - 1, one after another:
//               f32 scale | i8 codes[min(block, n - b * block)]
//     subspace  forward: u32 tokens[rows] | f32 coefficients[n];  backward: f32 coefficients[n]
//     columns   u32 columns[width] | f32 values[n]
//
// direction is 1 forward, 2 backward; codec is 1 f32, 2 bf16, 3 int8, 4 subspace, 5 columns;
// stage is the sender's stage index. rows >= 1 and width >= 1; block is 1 or more for int8, the
// full width (>= width) for columns, and 0 for every other codec. The size of a message is fixed
// by its header alone (boundary_encoded_size).
//
// What decoding promises, for any bytes at all: either a BoundaryMessage whose every field is
// consistent, with rows * width values, all finite, and rows token ids exactly when the codec is
// subspace and the direction forward (none otherwise), or an Error naming the field, the value
// and what is allowed. It never crashes, never reads out of bounds, and checks the sizes against
// the limits and the input's length before it allocates anything, so it never allocates more
// than about 4 times the input's size (an int8 code is 1 byte and decodes to a 4-byte float).
// Checked: magic, version, direction, codec, rows >= 1, 1 <= width <= max_width,
// rows * width <= max_values, block (1 to max_block for int8, width to max_width for columns,
// else 0), for columns every index below block and each above the one before, the body's length
// (no missing or trailing bytes), every value finite (a peer must not inject NaN or Inf), and
// for int8 every scale finite, >= 0 and with 127 * scale finite (so every value it decodes to is
// finite), no code -128, and only 0 codes in a block whose scale is 0.
//
// What a round trip promises: decode_boundary(encode_boundary(h, v, t, c)) has header h, tokens
// t, columns c, and values: v exactly (f32, subspace, columns; -0 stays -0), the bf16 rounding of
// v (bf16), and
// within scale / 2 of v per value, up to the float rounding of q * scale (int8; the scale is
// absmax / 127 rounded up to a float, so that |v| / scale <= 127, or down where 127 * scale
// would overflow: a block holding values within 2^-23 of the largest float). The encoding has
// exactly boundary_encoded_size(h) bytes. f32, bf16, subspace and columns encodings are canonical
// (a message has one encoding); int8 is not quite (a forged block may use a larger scale than its
// codes need, and re-encoding may move a scale by an ulp).
//
// Torch-free: the network and the fuzz target use it without libtorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

inline constexpr uint16_t kBoundaryVersion = 1;
inline constexpr size_t kBoundaryHeaderBytes = 36;

enum class BoundaryCodec : uint8_t {
  kF32 = 1,
  kBF16 = 2,
  kInt8 = 3,
  kSubspace = 4,
  kColumns = 5,
};

enum class BoundaryDirection : uint8_t {
  kForward = 1,   // activations, to the next stage
  kBackward = 2,  // gradients with respect to the activations, to the previous stage
};

const char* to_string(BoundaryCodec codec);          // "f32", "bf16", "int8", "subspace", "columns"
const char* to_string(BoundaryDirection direction);  // "forward", "backward"

struct BoundaryHeader {
  BoundaryDirection direction = BoundaryDirection::kForward;
  BoundaryCodec codec = BoundaryCodec::kF32;
  uint64_t step = 0;
  uint32_t micro_batch = 0;
  uint32_t stage = 0;  // the sender's stage index
  uint32_t rows = 0;   // tokens in the message: batch * time
  uint32_t width = 0;  // values per row: the hidden size d, or k for subspace and columns
  uint32_t block = 0;  // int8: values per block; columns: the full width d; else 0
  bool operator==(const BoundaryHeader&) const = default;
};

struct BoundaryMessage {
  BoundaryHeader header;
  std::vector<float> values;      // rows * width decoded floats, row-major
  std::vector<uint32_t> tokens;   // rows token ids for subspace forward; empty otherwise
  std::vector<uint32_t> columns;  // width column indices for columns; empty otherwise
  bool operator==(const BoundaryMessage&) const = default;
};

// What decoding accepts at most; a receiver sets them from the geometry it expects.
struct BoundaryLimits {
  uint64_t max_values = uint64_t{1} << 28;  // rows * width
  uint32_t max_width = uint32_t{1} << 20;
  uint32_t max_block = uint32_t{1} << 16;
};

// The exact encoded size of any message with this header, data-independent. Throws Error for a
// header that is not valid (unknown direction or codec, rows or width 0, block against the
// codec's rule, or a size past 2^64). Limits are not applied: they are the receiver's.
size_t boundary_encoded_size(const BoundaryHeader& header);

// The body bytes per token (per row) of a message of this geometry, excluding the fixed header:
// 4 * width (f32), 2 * width (bf16), width * (1 + 4 / block) (int8), 4 * width + 4 forward and
// 4 * width backward (subspace), 4 * width (columns, plus 4 * width per message for the indices).
// Exact for int8 when block divides rows * width; otherwise a message has the ceiling of it for its
// last, short block (at most 4 bytes more in all). `block` is used by int8 only (and must be >= 1
// there), ignored otherwise; `forward` matters to subspace only. Throws Error for an unknown codec
// or int8 with block 0.
double boundary_bytes_per_token(BoundaryCodec codec, uint32_t width, uint32_t block, bool forward);

// Throws Error when the header is not valid (as boundary_encoded_size), when values does not
// hold rows * width floats, when tokens does not hold rows ids for subspace forward or is not
// empty otherwise, when columns does not hold width increasing indices below block for columns
// or is not empty otherwise, when a value is not finite, or for bf16 when a value's rounding
// overflows.
std::string encode_boundary(const BoundaryHeader& header, std::span<const float> values,
                            std::span<const uint32_t> tokens,
                            std::span<const uint32_t> columns = {});

// Throws Error, naming what was wrong, for anything but a well-formed message within `limits`.
BoundaryMessage decode_boundary(std::string_view bytes, const BoundaryLimits& limits = {});

}  // namespace agora
