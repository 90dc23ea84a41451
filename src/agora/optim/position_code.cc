#include "agora/optim/position_code.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"

namespace agora {
namespace {

constexpr unsigned __int128 kTwoTo64 = static_cast<unsigned __int128>(1) << 64;
constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxTableEntries = uint64_t{1} << 20;
constexpr size_t kMaxTables = 4;

// C(p, j) for 0 <= p <= n and 1 <= j <= k, saturated at 2^64 - 1. Saturation never changes a
// decision: every rank is below C(n, k) < 2^64, so it is at most 2^64 - 2, and a saturated entry
// compares above it as the true value would.
struct BinomialTable {
  uint64_t n, k;
  std::vector<uint64_t> c;
  uint64_t operator()(uint64_t p, uint64_t j) const { return c[(j - 1) * (n + 1) + p]; }
};

std::shared_ptr<const BinomialTable> build_table(uint64_t n, uint64_t k) {
  auto t = std::make_shared<BinomialTable>();
  t->n = n;
  t->k = k;
  t->c.resize((n + 1) * k);
  uint64_t* row = t->c.data();
  for (uint64_t p = 0; p <= n; ++p) row[p] = p;
  for (uint64_t j = 2; j <= k; ++j) {
    const uint64_t* prev = row;
    row += n + 1;
    row[0] = 0;
    for (uint64_t p = 1; p <= n; ++p) {
      const uint64_t a = prev[p - 1], b = row[p - 1];
      row[p] = a > kSaturated - b ? kSaturated : a + b;  // Pascal's rule
    }
  }
  return t;
}

// The shared table for (n, k), or null where it would be too large, or where it is not cached
// and `build` is false.
std::shared_ptr<const BinomialTable> table_for(uint64_t n, uint64_t k, bool build) {
  if (k > kMaxTableEntries / (n + 1)) return nullptr;  // (n + 1) * k could overflow
  static std::mutex mutex;
  static std::deque<std::shared_ptr<const BinomialTable>> cache;
  const std::lock_guard lock(mutex);
  for (const auto& t : cache) {
    if (t->n == n && t->k == k) return t;
  }
  if (!build) return nullptr;
  cache.push_back(build_table(n, k));
  if (cache.size() > kMaxTables) cache.pop_front();
  return cache.back();
}

// The same values as the table, computed: for (n, k) too large to tabulate.
struct BinomialComputed {
  uint64_t operator()(uint64_t p, uint64_t j) const {
    if (j == 1) return p;
    const unsigned __int128 c = binomial_saturated(p, j);
    return c >= kTwoTo64 ? kSaturated : static_cast<uint64_t>(c);
  }
};

uint64_t get_bits_slow(const uint8_t* data, uint64_t size, uint64_t bit, unsigned w);

// Bit `bit` onwards of `data` (`size` bytes), w <= 64 bits, least significant first. Reads only
// bytes below `size`; the caller makes sure the bits it asks for lie there.
[[gnu::always_inline]] inline uint64_t get_bits(const uint8_t* data, uint64_t size, uint64_t bit,
                                                unsigned w) {
  const uint64_t byte = bit >> 3;
  const unsigned shift = bit & 7;
  if (w <= 56 && byte + 8 <= size) {
    return (load_le64(data + byte) >> shift) & ((uint64_t{1} << w) - 1);
  }
  if (byte + 9 <= size) {  // up to 64 bits spanning 9 bytes
    uint64_t v = load_le64(data + byte) >> shift;
    if (shift != 0) v |= uint64_t{data[byte + 8]} << (64 - shift);
    return w == 64 ? v : v & ((uint64_t{1} << w) - 1);
  }
  return get_bits_slow(data, size, bit, w);
}

uint64_t get_bits_slow(const uint8_t* data, uint64_t size, uint64_t bit, unsigned w) {
  if (w == 0) return 0;
  if (w > 56) {
    return get_bits(data, size, bit, 32) | get_bits(data, size, bit + 32, w - 32) << 32;
  }
  uint64_t v = 0;
  for (uint64_t b = bit >> 3, s = 0; b < size && s < 64; ++b, s += 8) v |= uint64_t{data[b]} << s;
  return (v >> (bit & 7)) & ((uint64_t{1} << w) - 1);
}

// Writes into bytes already sized for the whole code (zeroed), so a put is shifts and one
// unaligned store rather than a push_back per byte.
class BitWriter {
 public:
  BitWriter(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  void put(uint64_t v, unsigned w) {
    if (w > 32) {
      put(v & 0xffffffffu, 32);
      put(v >> 32, w - 32);
      return;
    }
    acc_ |= (v & ((uint64_t{1} << w) - 1)) << fill_;
    fill_ += w;
    if (fill_ >= 32) flush(4);
  }
  // Writes what is left; the bits after it stay 0.
  void finish() {
    while (fill_ > 0) flush(1);
  }

 private:
  void flush(unsigned bytes) {
    if (at_ + 8 <= size_) {
      store_le64(acc_, data_ + at_);  // the bytes past `bytes` are rewritten by later stores
    } else {
      for (unsigned b = 0; b < bytes && at_ + b < size_; ++b)
        data_[at_ + b] = (acc_ >> 8 * b) & 0xff;
    }
    at_ += bytes;
    acc_ >>= 8 * bytes;
    fill_ = fill_ > 8 * bytes ? fill_ - 8 * bytes : 0;
  }

  uint8_t* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// Where C(p, j) <= r < C(p + 1, j) puts p, from the polynomial C(p, j) is, solved in doubles:
// with q = p - (j - 1) / 2, j! C(p, j) is q^2 - 1/4, q^3 - q, (q^2 - 5/4)^2 - 1 for j = 2, 3, 4
// (exact inverses but for rounding; a first-order correction for 3), q^j roughly beyond, 2 <= j
// <= 6. For r = 0 it is at most j - 1, the answer then.
inline double approximate_position(uint64_t r, uint64_t j) {
  const double x = static_cast<double>(r);
  switch (j) {
    case 2:
      return std::sqrt(2 * x + 0.25) + 0.5;
    case 3: {
      // y = cbrt(6x) by Newton's method on z = 1 / cbrt(6x), from the exponent divided by 3:
      // no libm call and no division, so a group of chunks pipelines; 3 steps leave a relative
      // error under 1e-9. The correction 1 / (3y) is z / 3 (at most 1/3: z is huge for x = 0).
      const double x6 = 6 * x;
      double z = std::bit_cast<double>(0x553ef0ff289dd796ull - std::bit_cast<uint64_t>(x6) / 3);
      for (int step = 0; step < 3; ++step) z = z * (4 - x6 * z * z * z) * (1.0 / 3);
      return x6 * z * z + std::min(z, 1.0) * (1.0 / 3) + 1;
    }
    case 4:
      return std::sqrt(1.25 + std::sqrt(24 * x + 1)) + 1.5;
    default: {
      static constexpr double kFactorial[] = {1, 1, 2, 6, 24, 120, 720};
      return std::pow(x * kFactorial[j], 1.0 / static_cast<double>(j)) +
             0.5 * static_cast<double>(j - 1);
    }
  }
}

// The largest p in [lo, hi] with C(p, j) <= r, given C(lo, j) <= r < C(hi + 1, j), starting from
// `guess`: approximate_position() is almost always right already, and the integer comparisons
// alone decide the answer, so rounding in the guess cannot change it.
template <class Binomial>
uint64_t walk_from(const Binomial& C, double guess, uint64_t r, uint64_t j, uint64_t lo,
                   uint64_t hi) {
  uint64_t p = guess <= static_cast<double>(lo)   ? lo
               : guess >= static_cast<double>(hi) ? hi
                                                  : static_cast<uint64_t>(guess);
  // Both bounds are loaded before either is tested, so the loads overlap.
  const uint64_t below = C(p, j), above = p < hi ? C(p + 1, j) : ~uint64_t{0};
  if (below <= r && above > r) [[likely]] {
    return p;
  }
  while (p < hi && C(p + 1, j) <= r) ++p;
  while (C(p, j) > r) --p;
  return p;
}

// The same by bisection, for j > 6.
template <class Binomial>
uint64_t bisect(const Binomial& C, uint64_t r, uint64_t j, uint64_t lo, uint64_t hi) {
  if (r == 0) return lo;  // C(p, j) = 0 exactly for p < j, and lo = j - 1
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (C(mid, j) <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <class Binomial>
void decode_ranks(const Binomial& C, const uint8_t* data, uint64_t size, uint64_t chunks,
                  uint64_t n, uint64_t k, uint64_t count, unsigned width, uint32_t* positions,
                  const std::string& where) {
  // Chunks are independent: stepping a group of them through each level together, all the
  // floating-point guesses first, gives the processor independent chains to overlap.
  constexpr uint64_t kGroup = 16;
  uint64_t r[kGroup], hi[kGroup];
  double guess[kGroup];
  for (uint64_t c0 = 0; c0 < chunks; c0 += kGroup) {
    const uint64_t group = std::min(kGroup, chunks - c0);
    for (uint64_t g = 0; g < group; ++g) {
      r[g] = get_bits(data, size, (c0 + g) * width, width);
      if (r[g] >= count) {
        fail("{}: the position rank of chunk {} is {} (allowed: < C({}, {}) = {})", where, c0 + g,
             r[g], n, k, count);
      }
      hi[g] = n - 1;
    }
    // Greedy inversion of r = sum_i C(p_i, i + 1): the residual after p_i is below C(p_i, i),
    // so each p_{i-1} lands below p_i and the set is ascending and in range by construction.
    uint32_t* out = positions + c0 * k;
    for (uint64_t i = k - 1; i > 0; --i) {
      const uint64_t j = i + 1;
      if (j > 6) {
        for (uint64_t g = 0; g < group; ++g) {
          const uint64_t p = bisect(C, r[g], j, i, hi[g]);
          out[g * k + i] = static_cast<uint32_t>(p);
          r[g] -= C(p, j);
          hi[g] = p - 1;
        }
        continue;
      }
      for (uint64_t g = 0; g < group; ++g) guess[g] = approximate_position(r[g], j);
      for (uint64_t g = 0; g < group; ++g) {
        const uint64_t p = walk_from(C, guess[g], r[g], j, i, hi[g]);
        out[g * k + i] = static_cast<uint32_t>(p);
        r[g] -= C(p, j);
        hi[g] = p - 1;
      }
    }
    for (uint64_t g = 0; g < group; ++g) out[g * k] = static_cast<uint32_t>(r[g]);  // C(p, 1) = p
  }
}

// One chunk, every deviation named: what decode_elias_fano() falls back on to say what is wrong.
[[noreturn]] void refuse_elias_fano_chunk(const uint8_t* data, uint64_t size, uint64_t c,
                                          uint64_t n, uint64_t k, unsigned low, uint64_t chunk_bits,
                                          const std::string& where) {
  const uint64_t max_high = (n - 1) >> low;
  const uint64_t high_bits = k + max_high;
  const uint64_t base = c * chunk_bits;
  std::vector<uint64_t> out(k);
  for (uint64_t i = 0; i < k; ++i) out[i] = get_bits(data, size, base + i * low, low);
  const uint64_t bitmap = base + k * low;
  uint64_t i = 0;
  for (uint64_t offset = 0; offset < high_bits; offset += 64) {
    const auto w = static_cast<unsigned>(std::min<uint64_t>(64, high_bits - offset));
    for (uint64_t word = get_bits(data, size, bitmap + offset, w); word != 0; word &= word - 1) {
      if (i == k) {
        fail(
            "{}: the Elias-Fano bitmap of chunk {} has more than {} bits set (allowed: exactly "
            "{}, one per position)",
            where, c, k, k);
      }
      const uint64_t high = offset + static_cast<uint64_t>(std::countr_zero(word)) - i;
      const uint64_t p = high > max_high ? n : (high << low | out[i]);
      if (p >= n) {
        fail(
            "{}: position {} of chunk {} is out of range (high part {}, low part {}; allowed: "
            "< {})",
            where, i, c, high, out[i], n);
      }
      if (i > 0 && p <= out[i - 1]) {
        fail("{}: positions in chunk {} are not strictly ascending ({} follows {})", where, c, p,
             out[i - 1]);
      }
      out[i++] = p;
    }
  }
  fail(
      "{}: the Elias-Fano bitmap of chunk {} has {} bits set (allowed: exactly {}, one per "
      "position)",
      where, c, i, k);
}

// The fast path's checks are branches that a valid payload never takes; the first one taken
// hands the chunk to the refusal above for the message.
void decode_elias_fano(const uint8_t* data, uint64_t size, uint64_t chunks, uint64_t n, uint64_t k,
                       unsigned low, uint64_t chunk_bits, uint32_t* positions,
                       const std::string& where) {
  const uint64_t max_high = (n - 1) >> low;
  const uint64_t high_bits = k + max_high;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t base = c * chunk_bits;
    uint32_t* out = positions + c * k;
    for (uint64_t i = 0; i < k; ++i) {
      out[i] = static_cast<uint32_t>(get_bits(data, size, base + i * low, low));
    }
    const uint64_t bitmap = base + k * low;
    uint64_t i = 0, next = 0;  // next: the least the next position may be
    for (uint64_t offset = 0; offset < high_bits; offset += 64) {
      const auto w = static_cast<unsigned>(std::min<uint64_t>(64, high_bits - offset));
      for (uint64_t word = get_bits(data, size, bitmap + offset, w); word != 0; word &= word - 1) {
        const uint64_t high = offset + static_cast<uint64_t>(std::countr_zero(word)) - i;
        if (i == k || high > max_high) [[unlikely]] {
          refuse_elias_fano_chunk(data, size, c, n, k, low, chunk_bits, where);
        }
        const uint64_t p = high << low | out[i];
        if (p >= n || p < next) [[unlikely]] {
          refuse_elias_fano_chunk(data, size, c, n, k, low, chunk_bits, where);
        }
        out[i++] = static_cast<uint32_t>(p);
        next = p + 1;
      }
    }
    if (i != k) [[unlikely]] {
      refuse_elias_fano_chunk(data, size, c, n, k, low, chunk_bits, where);
    }
  }
}

}  // namespace

unsigned __int128 binomial_saturated(uint64_t n, uint64_t k) {
  if (k > n) return 0;
  const uint64_t m = std::min(k, n - k);
  // C(n, i) rises with i up to n / 2, so once past 2^64 it stays there; each step is exact
  // (C(n, i) * (n - i) = C(n, i + 1) * (i + 1)) and fits 128 bits (< 2^64 * 2^64).
  unsigned __int128 c = 1;
  for (uint64_t i = 0; i < m; ++i) {
    c = c * (n - i) / (i + 1);
    if (c >= kTwoTo64) return kTwoTo64;
  }
  return c;
}

PositionCode::PositionCode(uint64_t n, uint64_t k) : n_(n), k_(k) {
  const unsigned __int128 count = binomial_saturated(n, k);
  if (count < kTwoTo64) {
    kind_ = Kind::kRank;
    count_ = static_cast<uint64_t>(count);
    chunk_bits_ = static_cast<uint64_t>(std::bit_width(count_ - 1));
    return;
  }
  kind_ = Kind::kEliasFano;
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (uint32_t low = 0; low <= 32; ++low) {
    const uint64_t bits = k * low + k + ((n - 1) >> low);
    if (bits < best) {
      best = bits;
      low_bits_ = low;
    }
  }
  chunk_bits_ = best;
}

void PositionCode::encode(const uint32_t* positions, uint64_t chunks, std::string& out) const {
  const size_t start = out.size();
  out.resize(start + bytes(chunks));
  BitWriter writer(reinterpret_cast<uint8_t*>(out.data()) + start, bytes(chunks));
  if (kind_ == Kind::kRank) {
    const auto table = table_for(n_, k_, true);
    const auto rank_of = [&](const auto& C) {
      for (uint64_t c = 0; c < chunks; ++c) {
        const uint32_t* p = positions + c * k_;
        uint64_t r = 0;
        for (uint64_t i = 0; i < k_; ++i) r += C(p[i], i + 1);
        writer.put(r, static_cast<unsigned>(chunk_bits_));
      }
    };
    if (table) {
      rank_of(*table);
    } else {
      rank_of(BinomialComputed{});
    }
  } else {
    const uint64_t high_bits = k_ + ((n_ - 1) >> low_bits_);
    std::vector<uint64_t> bitmap((high_bits + 63) / 64);
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint32_t* p = positions + c * k_;
      std::fill(bitmap.begin(), bitmap.end(), 0);
      for (uint64_t i = 0; i < k_; ++i) {
        writer.put(p[i], low_bits_);
        const uint64_t bit = (uint64_t{p[i]} >> low_bits_) + i;
        bitmap[bit / 64] |= uint64_t{1} << (bit % 64);
      }
      for (uint64_t w = 0; w < bitmap.size(); ++w) {
        writer.put(bitmap[w], static_cast<unsigned>(std::min<uint64_t>(64, high_bits - 64 * w)));
      }
    }
  }
  writer.finish();
}

void PositionCode::decode(const uint8_t* data, uint64_t chunks, uint32_t* positions,
                          const std::string& where) const {
  const uint64_t size = bytes(chunks);
  if (kind_ == Kind::kRank) {
    const auto width = static_cast<unsigned>(chunk_bits_);
    // Bytes from anyone must not make a decoder build an (n + 1) x k table for a chunk or two:
    // it builds one only for at least (n + 1) / 64 chunks, and otherwise uses a cached one or
    // computes.
    if (const auto table = table_for(n_, k_, chunks * 64 >= n_ + 1)) {
      decode_ranks(*table, data, size, chunks, n_, k_, count_, width, positions, where);
    } else {
      decode_ranks(BinomialComputed{}, data, size, chunks, n_, k_, count_, width, positions, where);
    }
  } else {
    decode_elias_fano(data, size, chunks, n_, k_, low_bits_, chunk_bits_, positions, where);
  }
  // Unused bits must be 0 so that each set of positions has one encoding.
  const uint64_t used = chunks * chunk_bits_ % 8;
  if (used != 0 && (data[size - 1] >> used) != 0) {
    fail(
        "{}: the padding bits after the last chunk's positions are not 0 (byte 0x{:02x}, {} bits "
        "used)",
        where, data[size - 1], used);
  }
}

}  // namespace agora
