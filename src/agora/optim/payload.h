// Payload: one peer's contribution to one step, as the bytes that cross the internet.
//
// Every strategy's contribution uses this one container, so the network, the blob store and
// `agora inspect payload` handle a single format:
//   - DeMo sends, per tensor, the top-k DCT coefficients of each chunk (positions and values);
//   - all-reduce AdamW sends dense gradients (fp32 or bf16);
//   - DiLoCo sends dense pseudo-gradients (fp32, bf16, or int8 with one fp32 scale per row).
//
// Wire format, version 2, all integers little-endian:
//
//   header   "AGPL" | u16 version = 2 | u8 kind | u8 flags = 0 | u64 step | u32 tensor_count
//   tensor   u8 ndim (1..8) | u8 encoding | u8 value_type | u8 reserved = 0 | u32 dims[ndim]
//            then, by encoding:
//     dct_topk   u32 chunk_rows | u32 chunk_cols | u32 topk
//                positions: each chunk's set of topk positions in the same number of bits,
//                  fixed by n = chunk_rows * chunk_cols (at most 2^32) and k = topk alone,
//                  chunks one after another, least significant bit first, padding bits 0 up to
//                  a whole byte (position_code.h has the exact bits):
//                  when C(n, k) < 2^64, the rank sum_i C(p_i, i + 1) of the ascending positions
//                    p_0 < ... < p_{k-1} in bit_width(C(n, k) - 1) bits (below C(n, k));
//                  otherwise Elias-Fano: k low parts of L bits, then k + ((n - 1) >> L) bits
//                    with bit (p_i >> L) + i set for each i, L minimising the total
//                values[chunks * topk]: f32 or bf16, or one_bit packed 8 per byte, least
//                  significant bit first, bit set = negative (ceil(n / 8) bytes, padding bits 0)
//     dense      values[numel]: f32 or bf16
//     int8_rows  f32 scales[rows] | i8 values[numel]    (value_type must be int8)
//
// Version 1 (fixed-width u8/u16/u32 positions) is refused with an error that says so: at top-k 4
// of 4096 its positions took 64 bits per chunk where the rank takes 44.
//
// Chunks: a 1-D tensor [N] is cut into rows of chunk_cols (chunk_rows must be 1); a tensor with
// two or more dimensions [..., M, N] is cut into blocks of chunk_rows x chunk_cols over its last
// two dimensions, the leading ones being a batch; chunks are numbered in row-major block order and
// a position inside a chunk is row * chunk_cols + column. Rows for int8_rows: the product of all
// dimensions but the last (1 for a 1-D tensor), each of the last dimension's length.
//
// What decoding promises, for any bytes at all: either a Payload whose every field is consistent
// (the checks below) or an Error naming the tensor, the field, the value and what is allowed. It
// never crashes, never reads out of bounds and never allocates more than about 64 times the
// input's size (a one-bit value is 1 bit and decodes to a float and a u32 position, 8 bytes, and
// when topk = chunk size its positions take no bits at all; a minimal tensor entry of 10 bytes
// decodes to ~170 bytes of structures), besides position_code.h's shared binomial tables, at
// most 32 MiB in all. Checked: magic, version, kind, reserved fields, tensor count, ndim,
// dimensions (>= 1, element count < 2^40), encoding and value-type pairs, chunk sizes dividing
// their dimensions and at most 2^32, 1 <= topk <= chunk size, position codes (ranks in range, exact
// Elias-Fano bitmaps, positions in range and strictly ascending per chunk, padding 0), every
// float finite, every scale finite and >= 0, and no missing or trailing bytes. With an expected
// layout it also checks the kind, the tensor count and each tensor's layout against it.
//
// Encoding is canonical: a Payload has exactly one encoding, so equal contents have equal hashes.
// decode(encode(p)) == p bit for bit (bf16 and one-bit values are exact in their float form).
//
// Torch-free: the network and the fuzz target use it without libtorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

inline constexpr uint16_t kPayloadVersion = 2;

enum class PayloadKind : uint8_t {
  kDemo = 1,            // DeMo: top-k DCT coefficients of the momentum
  kGradient = 2,        // all-reduce: the dense gradient
  kPseudoGradient = 3,  // DiLoCo: shared minus local parameters after the inner steps
};

enum class TensorEncoding : uint8_t {
  kDctTopK = 1,
  kDense = 2,
  kInt8Rows = 3,
};

enum class ValueType : uint8_t {
  kF32 = 1,
  kBF16 = 2,
  kOneBit = 3,  // dct_topk only
  kInt8 = 4,    // int8_rows only
};

const char* to_string(PayloadKind kind);
const char* to_string(TensorEncoding encoding);
const char* to_string(ValueType type);

// Everything about a tensor's entry except its data. Sizes are data-independent: a layout fixes
// the exact number of bytes its data takes.
struct TensorLayout {
  std::vector<int64_t> shape;
  TensorEncoding encoding = TensorEncoding::kDense;
  ValueType value_type = ValueType::kF32;
  // dct_topk only; other encodings have chunk_rows = chunk_cols = 1 and topk = 0.
  int64_t chunk_rows = 1, chunk_cols = 1, topk = 0;

  int64_t numel() const;
  int64_t chunk_size() const { return chunk_rows * chunk_cols; }  // coefficients per chunk
  int64_t num_chunks() const;                                     // dct_topk: numel / chunk_size
  int64_t rows() const;                                           // int8_rows: see above
  int64_t value_count() const;  // dct_topk: chunks * topk; otherwise numel
  bool operator==(const TensorLayout&) const = default;
};

struct TensorPayload {
  TensorLayout layout;
  // dct_topk: chunk c's selections are positions[c*topk .. c*topk + topk), ascending.
  std::vector<uint32_t> positions;
  // dct_topk and dense: value_count() values. bf16 values are held as the floats they encode
  // exactly; one-bit values are +1.0f or -1.0f (encode() maps v < 0 to -1 and anything else,
  // +0 and -0 included, to +1).
  std::vector<float> values;
  // int8_rows: value_count() quantized values and rows() scales; element = q * scale of its row.
  std::vector<int8_t> quantized;
  std::vector<float> scales;
  bool operator==(const TensorPayload&) const = default;
};

struct Payload {
  PayloadKind kind = PayloadKind::kDemo;
  uint64_t step = 0;
  std::vector<TensorPayload> tensors;  // in the model's parameter order
  bool operator==(const Payload&) const = default;
};

struct PayloadLayout {
  PayloadKind kind = PayloadKind::kDemo;
  std::vector<TensorLayout> tensors;
};

// The exact encoded size of any payload with this layout. Throws Error, as decoding would, for a
// layout that is not valid (bad ndim, dimensions, chunks, topk, or encoding and value-type pair).
size_t encoded_size(const PayloadLayout& layout);

// Throws Error when `payload` is inconsistent (the same checks decoding makes, except that
// one-bit and bf16 values are rounded rather than required to be exact).
std::string encode_payload(const Payload& payload);

// Throws Error, naming what was wrong, for anything but a well-formed payload.
Payload decode_payload(std::string_view bytes);
// The same, and the payload must also match `expected` (kind, tensor count, every layout).
Payload decode_payload(std::string_view bytes, const PayloadLayout& expected);

// The bf16 value nearest to `value` (round to nearest even), as a float; exact for bf16 values.
float round_to_bf16(float value);

}  // namespace agora
