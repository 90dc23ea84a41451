#include "agora/pipeline/boundary_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "agora/core/byte_reader.h"
#include "agora/core/error.h"
#include "agora/core/little_endian.h"

namespace agora {
namespace {

constexpr uint8_t kMagic[4] = {'A', 'G', 'P', 'B'};
constexpr const char* kTop = "boundary message";

float load_f32(const uint8_t* p) {
  return std::bit_cast<float>(load_le32(p));
}
void store_f32(std::string& out, float v) {
  append_le(out, std::bit_cast<uint32_t>(v), 4);
}

// The bf16 value nearest to `value` (round to nearest even), as a float; exact for bf16 values.
// Callers have checked that `value` is finite; a finite value may still round to +-inf.
float round_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Adding just under half an ulp of bf16, plus the kept part's lowest bit, rounds to nearest
  // with ties to even; a carry into the exponent is the correct rounding up (to inf at the top).
  return std::bit_cast<float>((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

bool known_codec(BoundaryCodec codec) {
  const auto c = static_cast<uint8_t>(codec);
  return c >= 1 && c <= 5;
}
bool known_direction(BoundaryDirection direction) {
  const auto d = static_cast<uint8_t>(direction);
  return d == 1 || d == 2;
}
bool has_tokens(const BoundaryHeader& h) {
  return h.codec == BoundaryCodec::kSubspace && h.direction == BoundaryDirection::kForward;
}

// Every read goes through take(), which fails before anything past the end is touched.
// The enums and the geometry's rules, without limits (those are the receiver's). The order lets
// each step rely on the ones before.
void check_header(const BoundaryHeader& h) {
  if (!known_direction(h.direction)) {
    fail("{}: direction {} is unknown (allowed: 1 forward, 2 backward)", kTop,
         static_cast<int>(h.direction));
  }
  if (!known_codec(h.codec)) {
    fail("{}: codec {} is unknown (allowed: 1 f32, 2 bf16, 3 int8, 4 subspace, 5 columns)", kTop,
         static_cast<int>(h.codec));
  }
  if (h.rows < 1) fail("{}: rows is 0 (allowed: 1 or more)", kTop);
  if (h.width < 1) fail("{}: width is 0 (allowed: 1 or more)", kTop);
  if (h.codec == BoundaryCodec::kInt8 && h.block < 1) {
    fail("{}: block is 0 with codec int8 (allowed: 1 or more)", kTop);
  }
  if (h.codec == BoundaryCodec::kColumns && h.block < h.width) {
    fail(
        "{}: block is {} with codec columns and width {} (allowed: the row's full width, at "
        "least the kept columns)",
        kTop, h.block, h.width);
  }
  if (h.codec != BoundaryCodec::kInt8 && h.codec != BoundaryCodec::kColumns && h.block != 0) {
    fail("{}: block is {} with codec {} (allowed: 0; only int8 and columns use it)", kTop, h.block,
         to_string(h.codec));
  }
}

uint64_t value_count(const BoundaryHeader& h) {
  // Two u32 factors: the product is below 2^64.
  return uint64_t{h.rows} * h.width;
}

uint64_t block_count(const BoundaryHeader& h) {
  const uint64_t n = value_count(h);
  return n / h.block + (n % h.block != 0 ? 1 : 0);
}

// The body's exact size for a header that passed check_header(); Error past 2^64 bytes.
uint64_t body_bytes(const BoundaryHeader& h) {
  const uint64_t n = value_count(h);
  uint64_t size = 0;
  bool overflow = false;
  switch (h.codec) {
    case BoundaryCodec::kF32:
      overflow = __builtin_mul_overflow(n, uint64_t{4}, &size);
      break;
    case BoundaryCodec::kBF16:
      overflow = __builtin_mul_overflow(n, uint64_t{2}, &size);
      break;
    case BoundaryCodec::kInt8:
      overflow = __builtin_mul_overflow(block_count(h), uint64_t{4}, &size) ||
                 __builtin_add_overflow(size, n, &size);
      break;
    case BoundaryCodec::kSubspace:
      overflow = __builtin_mul_overflow(n, uint64_t{4}, &size) ||
                 (has_tokens(h) && __builtin_add_overflow(size, uint64_t{4} * h.rows, &size));
      break;
    case BoundaryCodec::kColumns:
      overflow = __builtin_mul_overflow(n, uint64_t{4}, &size) ||
                 __builtin_add_overflow(size, uint64_t{4} * h.width, &size);
      break;
  }
  if (overflow || size > std::numeric_limits<uint64_t>::max() - kBoundaryHeaderBytes) {
    fail("{}: {} rows x {} values of codec {} take 2^64 bytes or more (allowed: less)", kTop,
         h.rows, h.width, to_string(h.codec));
  }
  return size;
}

std::string describe(const BoundaryHeader& h) {
  return fmt::format("{} ({}, {}, step {}, micro-batch {}, stage {}, {} x {})", kTop,
                     to_string(h.direction), to_string(h.codec), h.step, h.micro_batch, h.stage,
                     h.rows, h.width);
}

void fail_value(const std::string& where, const BoundaryHeader& h, uint64_t i, float v,
                const char* allowed) {
  fail("{}: value {} (row {}, column {}) is {} (allowed: {})", where, i, i / h.width, i % h.width,
       v, allowed);
}

void check_finite(const std::vector<float>& values, const BoundaryHeader& h,
                  const std::string& where) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) fail_value(where, h, i, values[i], "finite numbers");
  }
}

// A scale the decoder accepts: every q * scale with |q| <= 127 is then finite as well.
bool valid_scale(float scale) {
  return std::isfinite(scale) && scale >= 0 && std::isfinite(scale * 127.0f);
}

// The scale of a block whose largest magnitude is `absmax` > 0 (finite): absmax / 127 rounded up
// to a float, so that |v| / scale <= 127 for every value of the block (and scale > 0 even where
// absmax / 127 underflows), unless that would make 127 * scale overflow.
float int8_scale(float absmax) {
  float scale = absmax / 127.0f;
  if (static_cast<double>(scale) * 127.0 < static_cast<double>(absmax)) {
    scale = std::nextafter(scale, std::numeric_limits<float>::infinity());
  }
  while (!std::isfinite(scale * 127.0f)) {
    scale = std::nextafter(scale, 0.0f);
  }
  return scale;
}

void write_int8(std::string& out, const BoundaryHeader& h, std::span<const float> values) {
  const size_t n = values.size();
  for (size_t begin = 0; begin < n; begin += h.block) {
    const size_t end = begin + std::min<size_t>(h.block, n - begin);
    float absmax = 0;
    for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(values[i]));
    if (absmax == 0) {
      store_f32(out, 0.0f);
      out.append(end - begin, '\0');
      continue;
    }
    const float scale = int8_scale(absmax);
    store_f32(out, scale);
    for (size_t i = begin; i < end; ++i) {
      const double q = std::round(static_cast<double>(values[i]) / static_cast<double>(scale));
      const auto code = static_cast<int8_t>(std::clamp(q, -127.0, 127.0));
      out.push_back(static_cast<char>(code));
    }
  }
}

// `p` holds the int8 body of `h`; values has value_count(h) entries.
void read_int8(const uint8_t* p, const BoundaryHeader& h, std::vector<float>& values,
               const std::string& where) {
  const size_t n = values.size();
  size_t b = 0;
  for (size_t begin = 0; begin < n; begin += h.block, ++b) {
    const size_t len = std::min<size_t>(h.block, n - begin);
    const float scale = load_f32(p);
    if (!valid_scale(scale)) {
      fail(
          "{}: block {} has scale {} (allowed: finite and >= 0, with 127 * scale finite: about "
          "{} at most)",
          where, b, scale, std::numeric_limits<float>::max() / 127.0f);
    }
    const auto* codes = reinterpret_cast<const int8_t*>(p + 4);
    for (size_t j = 0; j < len; ++j) {
      const int8_t q = codes[j];
      if (q == -128) {
        fail("{}: block {} code {} (value {}) is -128 (allowed: -127 to 127)", where, b, j,
             begin + j);
      }
      if (scale == 0 && q != 0) {
        fail(
            "{}: block {} has scale 0 but code {} (value {}) is {} (allowed: 0 when the scale is "
            "0)",
            where, b, j, begin + j, q);
      }
      values[begin + j] = static_cast<float>(q) * scale;
    }
    p += 4 + len;
  }
}

template <size_t N>
const char* name_of(const char* const (&names)[N], uint8_t value) {
  return value >= 1 && value < N ? names[value] : "unknown";
}

}  // namespace

const char* to_string(BoundaryCodec codec) {
  static const char* const kNames[] = {"", "f32", "bf16", "int8", "subspace", "columns"};
  return name_of(kNames, static_cast<uint8_t>(codec));
}

const char* to_string(BoundaryDirection direction) {
  static const char* const kNames[] = {"", "forward", "backward"};
  return name_of(kNames, static_cast<uint8_t>(direction));
}

size_t boundary_encoded_size(const BoundaryHeader& header) {
  check_header(header);
  return kBoundaryHeaderBytes + body_bytes(header);
}

double boundary_bytes_per_token(BoundaryCodec codec, uint32_t width, uint32_t block, bool forward) {
  const double w = width;
  switch (codec) {
    case BoundaryCodec::kF32:
      return 4 * w;
    case BoundaryCodec::kBF16:
      return 2 * w;
    case BoundaryCodec::kInt8:
      if (block < 1) fail("{}: block is 0 with codec int8 (allowed: 1 or more)", kTop);
      return w + 4 * w / block;
    case BoundaryCodec::kSubspace:
      return 4 * w + (forward ? 4 : 0);
    case BoundaryCodec::kColumns:
      return 4 * w;
  }
  fail("{}: codec {} is unknown (allowed: 1 f32, 2 bf16, 3 int8, 4 subspace, 5 columns)", kTop,
       static_cast<int>(codec));
}

std::string encode_boundary(const BoundaryHeader& header, std::span<const float> values,
                            std::span<const uint32_t> tokens, std::span<const uint32_t> columns) {
  check_header(header);
  const uint64_t size = kBoundaryHeaderBytes + body_bytes(header);
  const std::string where = describe(header);
  if (values.size() != value_count(header)) {
    fail("{}: {} values given, expected rows x width = {}", where, values.size(),
         value_count(header));
  }
  const size_t want_tokens = has_tokens(header) ? header.rows : 0;
  if (tokens.size() != want_tokens) {
    fail("{}: {} tokens given, expected {} ({})", where, tokens.size(), want_tokens,
         has_tokens(header) ? "one per row for subspace forward"
                            : "only subspace forward messages carry tokens");
  }
  const size_t want_columns = header.codec == BoundaryCodec::kColumns ? header.width : 0;
  if (columns.size() != want_columns) {
    fail("{}: {} column indices given, expected {} ({})", where, columns.size(), want_columns,
         want_columns ? "one per kept column" : "only columns messages carry them");
  }
  for (size_t c = 0; c < columns.size(); ++c) {
    if (columns[c] >= header.block || (c > 0 && columns[c] <= columns[c - 1])) {
      fail("{}: column index {} is {} (allowed: increasing, below the full width {})", where, c,
           columns[c], header.block);
    }
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) fail_value(where, header, i, values[i], "finite numbers");
    if (header.codec == BoundaryCodec::kBF16 && !std::isfinite(round_bf16(values[i]))) {
      fail_value(where, header, i, values[i], "|value| < 3.3961e38, which bf16 holds");
    }
  }

  std::string out;
  out.reserve(size);
  out.append(reinterpret_cast<const char*>(kMagic), sizeof(kMagic));
  append_le(out, kBoundaryVersion, 2);
  append_le(out, static_cast<uint8_t>(header.direction), 1);
  append_le(out, static_cast<uint8_t>(header.codec), 1);
  append_le(out, header.step, 8);
  append_le(out, header.micro_batch, 4);
  append_le(out, header.stage, 4);
  append_le(out, header.rows, 4);
  append_le(out, header.width, 4);
  append_le(out, header.block, 4);
  switch (header.codec) {
    case BoundaryCodec::kF32:
      for (const float v : values) store_f32(out, v);
      break;
    case BoundaryCodec::kBF16:
      for (const float v : values) append_le(out, std::bit_cast<uint32_t>(round_bf16(v)) >> 16, 2);
      break;
    case BoundaryCodec::kInt8:
      write_int8(out, header, values);
      break;
    case BoundaryCodec::kSubspace:
      for (const uint32_t t : tokens) append_le(out, t, 4);
      for (const float v : values) store_f32(out, v);
      break;
    case BoundaryCodec::kColumns:
      for (const uint32_t c : columns) append_le(out, c, 4);
      for (const float v : values) store_f32(out, v);
      break;
  }
  return out;
}

BoundaryMessage decode_boundary(std::string_view bytes, const BoundaryLimits& limits) {
  ByteReader r(bytes);
  const uint8_t* magic = r.take(4, kTop, "the magic");
  if (std::memcmp(magic, kMagic, 4) != 0) {
    fail(
        "{}: magic is {:02x} {:02x} {:02x} {:02x}, expected 41 47 50 42 (\"AGPB\"): not an "
        "agora boundary message",
        kTop, magic[0], magic[1], magic[2], magic[3]);
  }
  const uint64_t version = r.uint(2, kTop, "the version");
  if (version != kBoundaryVersion) {
    fail("{}: version {} is not supported (allowed: {})", kTop, version, kBoundaryVersion);
  }
  BoundaryMessage m;
  BoundaryHeader& h = m.header;
  h.direction = static_cast<BoundaryDirection>(r.uint(1, kTop, "the direction"));
  h.codec = static_cast<BoundaryCodec>(r.uint(1, kTop, "the codec"));
  h.step = r.uint(8, kTop, "the step");
  h.micro_batch = static_cast<uint32_t>(r.uint(4, kTop, "the micro-batch"));
  h.stage = static_cast<uint32_t>(r.uint(4, kTop, "the stage"));
  h.rows = static_cast<uint32_t>(r.uint(4, kTop, "rows"));
  h.width = static_cast<uint32_t>(r.uint(4, kTop, "width"));
  h.block = static_cast<uint32_t>(r.uint(4, kTop, "block"));
  check_header(h);
  // The limits, then the length, before anything is allocated.
  if (h.width > limits.max_width) {
    fail("{}: width {} is too large (allowed: 1 to {})", kTop, h.width, limits.max_width);
  }
  const uint64_t n = value_count(h);
  if (n > limits.max_values) {
    fail("{}: rows x width = {} x {} = {} values, too many (allowed: at most {})", kTop, h.rows,
         h.width, n, limits.max_values);
  }
  if (h.codec == BoundaryCodec::kInt8 && h.block > limits.max_block) {
    fail("{}: block {} is too large (allowed: 1 to {})", kTop, h.block, limits.max_block);
  }
  if (h.codec == BoundaryCodec::kColumns && h.block > limits.max_width) {
    fail("{}: the full width (block) {} is too large (allowed: width to {})", kTop, h.block,
         limits.max_width);
  }
  const std::string where = describe(h);
  const uint64_t body = body_bytes(h);
  if (r.remaining() < body) {
    fail("{}: truncated: the body needs {} bytes at offset {}, but only {} remain", where, body,
         r.offset(), r.remaining());
  }
  if (r.remaining() > body) {
    fail("{}: {} trailing bytes after the body, which ends at offset {}", where,
         r.remaining() - body, r.offset() + body);
  }
  const uint8_t* p = r.take(body, kTop, "the body");
  m.values.resize(n);
  switch (h.codec) {
    case BoundaryCodec::kF32:
      for (size_t i = 0; i < n; ++i) m.values[i] = load_f32(p + 4 * i);
      check_finite(m.values, h, where);
      break;
    case BoundaryCodec::kBF16:
      for (size_t i = 0; i < n; ++i) {
        m.values[i] = std::bit_cast<float>(uint32_t{load_le16(p + 2 * i)} << 16);
      }
      check_finite(m.values, h, where);
      break;
    case BoundaryCodec::kInt8:
      read_int8(p, h, m.values, where);
      break;
    case BoundaryCodec::kSubspace:
      if (has_tokens(h)) {
        // Any u32: the caller checks the ids against its vocabulary.
        m.tokens.resize(h.rows);
        for (size_t i = 0; i < h.rows; ++i) m.tokens[i] = load_le32(p + 4 * i);
        p += 4 * size_t{h.rows};
      }
      for (size_t i = 0; i < n; ++i) m.values[i] = load_f32(p + 4 * i);
      check_finite(m.values, h, where);
      break;
    case BoundaryCodec::kColumns:
      m.columns.resize(h.width);
      for (size_t c = 0; c < h.width; ++c) {
        m.columns[c] = load_le32(p + 4 * c);
        if (m.columns[c] >= h.block || (c > 0 && m.columns[c] <= m.columns[c - 1])) {
          fail("{}: column index {} is {} (allowed: increasing, below the full width {})", where, c,
               m.columns[c], h.block);
        }
      }
      p += 4 * size_t{h.width};
      for (size_t i = 0; i < n; ++i) m.values[i] = load_f32(p + 4 * i);
      check_finite(m.values, h, where);
      break;
  }
  return m;
}

}  // namespace agora
