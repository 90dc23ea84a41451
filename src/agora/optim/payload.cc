#include "agora/optim/payload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "agora/core/byte_reader.h"
#include "agora/core/error.h"
#include "agora/core/little_endian.h"
#include "agora/optim/position_code.h"

namespace agora {
namespace {

constexpr uint8_t kMagic[4] = {'A', 'G', 'P', 'L'};
constexpr size_t kHeaderBytes = 20;  // magic, version, kind, flags, step, tensor_count
// The smallest tensor entry is a dense bf16 [1]: 8 bytes of header and 2 of data. Bounding the
// tensor count by it keeps a forged count from reserving more than the input could describe.
constexpr size_t kMinTensorBytes = 10;
constexpr size_t kMaxDims = 8;
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr int64_t kMaxDim = std::numeric_limits<uint32_t>::max();
// Positions are u32 in memory.
constexpr int64_t kMaxChunkSize = int64_t{1} << 32;

float load_f32(const uint8_t* p) {
  return std::bit_cast<float>(load_le32(p));
}
void store_f32(std::string& out, float v) {
  append_le(out, std::bit_cast<uint32_t>(v), 4);
}

std::string describe(size_t index, const std::vector<int64_t>& shape) {
  return fmt::format("payload tensor {} [{}]", index, fmt::join(shape, ", "));
}

bool known_kind(PayloadKind kind) {
  return kind == PayloadKind::kDemo || kind == PayloadKind::kGradient ||
         kind == PayloadKind::kPseudoGradient;
}

PositionCode position_code(const TensorLayout& l) {
  return PositionCode(static_cast<uint64_t>(l.chunk_size()), static_cast<uint64_t>(l.topk));
}

uint64_t value_bytes(ValueType type, int64_t n) {
  const auto count = static_cast<uint64_t>(n);
  return type == ValueType::kF32    ? 4 * count
         : type == ValueType::kBF16 ? 2 * count
         : type == ValueType::kInt8 ? count
                                    : (count + 7) / 8;  // one_bit
}

// The entry's bytes before its data, and its data; the layout must have passed check_layout().
uint64_t entry_header_bytes(const TensorLayout& l) {
  return 4 + 4 * l.shape.size() + (l.encoding == TensorEncoding::kDctTopK ? 12 : 0);
}
uint64_t data_bytes(const TensorLayout& l) {
  const auto count = static_cast<uint64_t>(l.value_count());
  if (l.encoding == TensorEncoding::kDctTopK) {
    return position_code(l).bytes(static_cast<uint64_t>(l.num_chunks())) +
           value_bytes(l.value_type, l.value_count());
  }
  if (l.encoding == TensorEncoding::kDense) return value_bytes(l.value_type, l.value_count());
  return 4 * static_cast<uint64_t>(l.rows()) + count;  // int8_rows
}

// Everything a layout must satisfy, checked in an order where each step may rely on the ones
// before (the element count fits before anything multiplies it, a chunk is >= 1 before it
// divides).
void check_layout(const TensorLayout& l, const std::string& where) {
  const size_t ndim = l.shape.size();
  if (ndim < 1 || ndim > kMaxDims) {
    fail("{}: ndim {} is invalid (allowed: 1 to {})", where, ndim, kMaxDims);
  }
  int64_t numel = 1;
  for (size_t i = 0; i < ndim; ++i) {
    const int64_t d = l.shape[i];
    if (d < 1 || d > kMaxDim) {
      fail("{}: dimension {} is {} (allowed: 1 to {})", where, i, d, kMaxDim);
    }
    if (d > (kMaxElements - 1) / numel) {
      fail("{}: the element count is too large (allowed: < 2^40)", where);
    }
    numel *= d;
  }
  const auto encoding = static_cast<int>(l.encoding);
  const auto type = static_cast<int>(l.value_type);
  if (type < 1 || type > 4) {
    fail("{}: value_type {} is unknown (allowed: 1 f32, 2 bf16, 3 one_bit, 4 int8)", where, type);
  }
  if (encoding < 1 || encoding > 3) {
    fail("{}: encoding {} is unknown (allowed: 1 dct_topk, 2 dense, 3 int8_rows)", where, encoding);
  }
  static const char* const kAllowed[] = {"", "f32, bf16 or one_bit", "f32 or bf16", "int8"};
  const bool ok = l.encoding == TensorEncoding::kDctTopK ? type <= 3
                  : l.encoding == TensorEncoding::kDense ? type <= 2
                                                         : type == 4;
  if (!ok) {
    fail("{}: value_type {} is not allowed with encoding {} (allowed: {})", where,
         to_string(l.value_type), to_string(l.encoding), kAllowed[encoding]);
  }
  if (l.encoding != TensorEncoding::kDctTopK) {
    if (l.chunk_rows != 1 || l.chunk_cols != 1 || l.topk != 0) {
      fail("{}: encoding {} has no chunks, but chunk is {} x {} and topk {} (allowed: 1 x 1, 0)",
           where, to_string(l.encoding), l.chunk_rows, l.chunk_cols, l.topk);
    }
    return;
  }
  const int64_t cols = l.shape[ndim - 1];
  if (ndim == 1 && l.chunk_rows != 1) {
    fail("{}: chunk_rows {} is invalid for a 1-D tensor (allowed: 1)", where, l.chunk_rows);
  }
  if (ndim >= 2 && (l.chunk_rows < 1 || l.shape[ndim - 2] % l.chunk_rows != 0)) {
    fail("{}: chunk_rows {} does not divide dimension {} ({})", where, l.chunk_rows, ndim - 2,
         l.shape[ndim - 2]);
  }
  if (l.chunk_cols < 1 || cols % l.chunk_cols != 0) {
    fail("{}: chunk_cols {} does not divide dimension {} ({})", where, l.chunk_cols, ndim - 1,
         cols);
  }
  if (l.chunk_size() > kMaxChunkSize) {
    fail("{}: a {} x {} chunk has {} coefficients, too many (allowed: <= 2^32)", where,
         l.chunk_rows, l.chunk_cols, l.chunk_size());
  }
  if (l.topk < 1 || l.topk > l.chunk_size()) {
    fail("{}: topk {} is out of range (allowed: 1 to {}, the size of a {} x {} chunk)", where,
         l.topk, l.chunk_size(), l.chunk_rows, l.chunk_cols);
  }
}

void check_expected(const TensorLayout& got, const TensorLayout& want, const std::string& where) {
  if (got.shape != want.shape) {
    fail("{}: shape is [{}], expected [{}]", where, fmt::join(got.shape, ", "),
         fmt::join(want.shape, ", "));
  }
  if (got.encoding != want.encoding) {
    fail("{}: encoding is {}, expected {}", where, to_string(got.encoding),
         to_string(want.encoding));
  }
  if (got.value_type != want.value_type) {
    fail("{}: value_type is {}, expected {}", where, to_string(got.value_type),
         to_string(want.value_type));
  }
  if (got.chunk_rows != want.chunk_rows || got.chunk_cols != want.chunk_cols) {
    fail("{}: chunk is {} x {}, expected {} x {}", where, got.chunk_rows, got.chunk_cols,
         want.chunk_rows, want.chunk_cols);
  }
  if (got.topk != want.topk) fail("{}: topk is {}, expected {}", where, got.topk, want.topk);
}

void check_positions(const TensorPayload& t, const std::string& where) {
  const TensorLayout& l = t.layout;
  const int64_t chunks = l.num_chunks();
  for (int64_t c = 0; c < chunks; ++c) {
    const uint32_t* p = t.positions.data() + c * l.topk;
    for (int64_t j = 0; j < l.topk; ++j) {
      if (p[j] >= l.chunk_size()) {
        fail("{}: position {} in chunk {} is out of range (allowed: < {})", where, p[j], c,
             l.chunk_size());
      }
      if (j > 0 && p[j] <= p[j - 1]) {
        fail("{}: positions in chunk {} are not strictly ascending ({} follows {})", where, c, p[j],
             p[j - 1]);
      }
    }
  }
}

void check_finite(const std::vector<float>& values, const std::string& where, const char* what) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      fail("{}: {} {} is {} (allowed: finite numbers)", where, what, i, values[i]);
    }
  }
}

void check_scales(const std::vector<float>& scales, const std::string& where) {
  for (size_t i = 0; i < scales.size(); ++i) {
    if (!std::isfinite(scales[i]) || scales[i] < 0) {
      fail("{}: scale {} is {} (allowed: finite and >= 0)", where, i, scales[i]);
    }
  }
}

// What encode_payload() requires of a tensor beyond its layout; decoding gets the sizes right by
// construction and checks the contents with the same functions.
void check_tensor(const TensorPayload& t, const std::string& where) {
  const TensorLayout& l = t.layout;
  const auto count = static_cast<size_t>(l.value_count());
  const bool topk = l.encoding == TensorEncoding::kDctTopK;
  const bool int8 = l.encoding == TensorEncoding::kInt8Rows;
  const auto check_size = [&](const char* field, size_t got, size_t want) {
    if (got != want) fail("{}: {} has {} entries, expected {}", where, field, got, want);
  };
  check_size("positions", t.positions.size(), topk ? count : 0);
  check_size("values", t.values.size(), int8 ? 0 : count);
  check_size("quantized", t.quantized.size(), int8 ? count : 0);
  check_size("scales", t.scales.size(), int8 ? static_cast<size_t>(l.rows()) : 0);
  if (topk) check_positions(t, where);
  check_finite(t.values, where, "value");
  check_scales(t.scales, where);
  if (l.value_type == ValueType::kBF16) {
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (!std::isfinite(round_to_bf16(t.values[i]))) {
        fail("{}: value {} is {}, which overflows bf16 (allowed: |value| < 3.3961e38)", where, i,
             t.values[i]);
      }
    }
  }
}

void write_values(std::string& out, ValueType type, const std::vector<float>& values) {
  if (type == ValueType::kF32) {
    for (const float v : values) store_f32(out, v);
  } else if (type == ValueType::kBF16) {
    for (const float v : values) append_le(out, std::bit_cast<uint32_t>(round_to_bf16(v)) >> 16, 2);
  } else {
    for (size_t begin = 0; begin < values.size(); begin += 8) {
      uint8_t byte = 0;
      for (size_t j = 0; j < 8 && begin + j < values.size(); ++j) {
        if (values[begin + j] < 0) byte |= static_cast<uint8_t>(1u << j);
      }
      out.push_back(static_cast<char>(byte));
    }
  }
}

// `p` holds value_bytes(type, n) bytes.
std::vector<float> read_values(const uint8_t* p, ValueType type, size_t n,
                               const std::string& where) {
  std::vector<float> values(n);
  if (type == ValueType::kF32) {
    for (size_t i = 0; i < n; ++i) values[i] = load_f32(p + 4 * i);
  } else if (type == ValueType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      values[i] = std::bit_cast<float>(uint32_t{load_le16(p + 2 * i)} << 16);
    }
  } else {
    // The bit is the float's sign bit on 1.0f: branch-free, and +-1 needs no finiteness check.
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bit = (p[i / 8] >> (i % 8)) & 1u;
      values[i] = std::bit_cast<float>(0x3f800000u | bit << 31);
    }
    // Unused bits must be 0 so that each payload has one encoding.
    if (n % 8 != 0 && (p[n / 8] >> (n % 8)) != 0) {
      fail("{}: the padding bits of the last one-bit byte are not 0 (byte 0x{:02x}, {} values)",
           where, p[n / 8], n);
    }
    return values;
  }
  check_finite(values, where, "value");
  return values;
}

Payload decode(std::string_view bytes, const PayloadLayout* expected) {
  ByteReader r(bytes);
  const std::string top = "payload";
  const uint8_t* magic = r.take(4, top, "the magic");
  if (std::memcmp(magic, kMagic, 4) != 0) {
    fail(
        "payload: magic is {:02x} {:02x} {:02x} {:02x}, expected 41 47 50 4c (\"AGPL\"): not an "
        "agora payload",
        magic[0], magic[1], magic[2], magic[3]);
  }
  const uint64_t version = r.uint(2, top, "the version");
  if (version != kPayloadVersion) {
    fail("payload: version {} is not supported (allowed: {}{})", version, kPayloadVersion,
         version == 1 ? "; version 1, with fixed-width positions, is no longer read" : "");
  }
  Payload payload;
  payload.kind = static_cast<PayloadKind>(r.uint(1, top, "the kind"));
  if (!known_kind(payload.kind)) {
    fail("payload: kind {} is unknown (allowed: 1 demo, 2 gradient, 3 pseudo_gradient)",
         static_cast<int>(payload.kind));
  }
  const uint64_t flags = r.uint(1, top, "the flags");
  if (flags != 0) fail("payload: flags is {} (allowed: 0)", flags);
  payload.step = r.uint(8, top, "the step");
  const uint64_t count = r.uint(4, top, "the tensor count");
  if (expected != nullptr) {
    if (payload.kind != expected->kind) {
      fail("payload: kind is {}, expected {}", to_string(payload.kind), to_string(expected->kind));
    }
    if (count != expected->tensors.size()) {
      fail("payload: tensor count is {}, expected {}", count, expected->tensors.size());
    }
  }
  if (count > r.remaining() / kMinTensorBytes) {
    fail("payload: tensor count {} cannot fit in the {} bytes after the header (allowed: <= {})",
         count, r.remaining(), r.remaining() / kMinTensorBytes);
  }
  payload.tensors.resize(count);
  for (size_t i = 0; i < count; ++i) {
    TensorPayload& t = payload.tensors[i];
    TensorLayout& l = t.layout;
    std::string where = fmt::format("payload tensor {}", i);
    const uint64_t ndim = r.uint(1, where, "ndim");
    l.encoding = static_cast<TensorEncoding>(r.uint(1, where, "the encoding"));
    l.value_type = static_cast<ValueType>(r.uint(1, where, "the value type"));
    const uint64_t reserved = r.uint(1, where, "the reserved byte");
    if (reserved != 0) fail("{}: reserved byte is {} (allowed: 0)", where, reserved);
    if (ndim < 1 || ndim > kMaxDims) {
      fail("{}: ndim {} is invalid (allowed: 1 to {})", where, ndim, kMaxDims);
    }
    const uint8_t* dims = r.take(4 * ndim, where, "the dimensions");
    for (size_t d = 0; d < ndim; ++d) l.shape.push_back(load_le32(dims + 4 * d));
    where = describe(i, l.shape);
    if (l.encoding == TensorEncoding::kDctTopK) {
      l.chunk_rows = r.uint(4, where, "chunk_rows");
      l.chunk_cols = r.uint(4, where, "chunk_cols");
      l.topk = r.uint(4, where, "topk");
    }
    check_layout(l, where);
    if (expected != nullptr) check_expected(l, expected->tensors[i], where);
    // Taking the whole data first proves the allocations below fit in the input.
    const uint8_t* p = r.take(data_bytes(l), where, "the data");
    const auto n = static_cast<size_t>(l.value_count());
    if (l.encoding == TensorEncoding::kDctTopK) {
      // The position code checks what check_positions() would: it yields only valid sets.
      const PositionCode code = position_code(l);
      const auto chunks = static_cast<uint64_t>(l.num_chunks());
      t.positions.resize(n);
      code.decode(p, chunks, t.positions.data(), where);
      t.values = read_values(p + code.bytes(chunks), l.value_type, n, where);
    } else if (l.encoding == TensorEncoding::kDense) {
      t.values = read_values(p, l.value_type, n, where);
    } else {
      t.scales.resize(static_cast<size_t>(l.rows()));
      for (size_t j = 0; j < t.scales.size(); ++j) t.scales[j] = load_f32(p + 4 * j);
      check_scales(t.scales, where);
      const uint8_t* q = p + 4 * t.scales.size();
      t.quantized.resize(n);
      for (size_t j = 0; j < n; ++j) t.quantized[j] = static_cast<int8_t>(q[j]);
    }
  }
  if (r.remaining() != 0) {
    fail("payload: {} trailing bytes after the last tensor, which ends at offset {}", r.remaining(),
         r.offset());
  }
  return payload;
}

// Names indexed by the enums' values; 0 and anything past the end are not valid values.
template <size_t N>
const char* name_of(const char* const (&names)[N], uint8_t value) {
  return value >= 1 && value < N ? names[value] : "unknown";
}

}  // namespace

const char* to_string(PayloadKind kind) {
  static const char* const kNames[] = {"", "demo", "gradient", "pseudo_gradient"};
  return name_of(kNames, static_cast<uint8_t>(kind));
}

const char* to_string(TensorEncoding encoding) {
  static const char* const kNames[] = {"", "dct_topk", "dense", "int8_rows"};
  return name_of(kNames, static_cast<uint8_t>(encoding));
}

const char* to_string(ValueType type) {
  static const char* const kNames[] = {"", "f32", "bf16", "one_bit", "int8"};
  return name_of(kNames, static_cast<uint8_t>(type));
}

int64_t TensorLayout::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

int64_t TensorLayout::num_chunks() const {
  return chunk_size() > 0 ? numel() / chunk_size() : 0;
}

int64_t TensorLayout::rows() const {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t TensorLayout::value_count() const {
  return encoding == TensorEncoding::kDctTopK ? num_chunks() * topk : numel();
}

size_t encoded_size(const PayloadLayout& layout) {
  uint64_t size = kHeaderBytes;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TensorLayout& l = layout.tensors[i];
    check_layout(l, describe(i, l.shape));
    size += entry_header_bytes(l) + data_bytes(l);
  }
  return size;
}

std::string encode_payload(const Payload& payload) {
  if (!known_kind(payload.kind)) {
    fail("payload: kind {} is unknown (allowed: 1 demo, 2 gradient, 3 pseudo_gradient)",
         static_cast<int>(payload.kind));
  }
  if (payload.tensors.size() > std::numeric_limits<uint32_t>::max()) {
    fail("payload: {} tensors is too many (allowed: < 2^32)", payload.tensors.size());
  }
  uint64_t size = kHeaderBytes;
  for (size_t i = 0; i < payload.tensors.size(); ++i) {
    const TensorPayload& t = payload.tensors[i];
    const std::string where = describe(i, t.layout.shape);
    check_layout(t.layout, where);
    check_tensor(t, where);
    size += entry_header_bytes(t.layout) + data_bytes(t.layout);
  }

  std::string out;
  out.reserve(size);
  out.append(reinterpret_cast<const char*>(kMagic), sizeof(kMagic));
  append_le(out, kPayloadVersion, 2);
  append_le(out, static_cast<uint8_t>(payload.kind), 1);
  append_le(out, 0, 1);  // flags
  append_le(out, payload.step, 8);
  append_le(out, payload.tensors.size(), 4);
  for (const TensorPayload& t : payload.tensors) {
    const TensorLayout& l = t.layout;
    append_le(out, l.shape.size(), 1);
    append_le(out, static_cast<uint8_t>(l.encoding), 1);
    append_le(out, static_cast<uint8_t>(l.value_type), 1);
    append_le(out, 0, 1);  // reserved
    for (const int64_t d : l.shape) append_le(out, static_cast<uint64_t>(d), 4);
    if (l.encoding == TensorEncoding::kDctTopK) {
      append_le(out, static_cast<uint64_t>(l.chunk_rows), 4);
      append_le(out, static_cast<uint64_t>(l.chunk_cols), 4);
      append_le(out, static_cast<uint64_t>(l.topk), 4);
      position_code(l).encode(t.positions.data(), static_cast<uint64_t>(l.num_chunks()), out);
      write_values(out, l.value_type, t.values);
    } else if (l.encoding == TensorEncoding::kDense) {
      write_values(out, l.value_type, t.values);
    } else {
      for (const float s : t.scales) store_f32(out, s);
      for (const int8_t q : t.quantized) append_le(out, static_cast<uint8_t>(q), 1);
    }
  }
  return out;
}

Payload decode_payload(std::string_view bytes) {
  return decode(bytes, nullptr);
}

Payload decode_payload(std::string_view bytes, const PayloadLayout& expected) {
  return decode(bytes, &expected);
}

float round_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // A NaN keeps its sign and gets the quiet bit, which survives the truncation.
  if (std::isnan(value)) return std::bit_cast<float>((bits | 0x00400000u) & 0xffff0000u);
  // Adding just under half an ulp of bf16, plus the kept part's lowest bit, rounds to nearest
  // with ties to even; a carry into the exponent is the correct rounding up (to inf at the top).
  return std::bit_cast<float>((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

}  // namespace agora
