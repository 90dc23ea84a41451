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

// The shared table for (n, k), or null where it would be too large.
std::shared_ptr<const BinomialTable> table_for(uint64_t n, uint64_t k) {
  if ((n + 1) * k > kMaxTableEntries) return nullptr;
  static std::mutex mutex;
  static std::deque<std::shared_ptr<const BinomialTable>> cache;
  const std::lock_guard lock(mutex);
  for (const auto& t : cache) {
    if (t->n == n && t->k == k) return t;
  }
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

// Bit `bit` onwards of `data` (`size` bytes), w <= 64 bits, least significant first. Reads only
// bytes below `size`; the caller makes sure the bits it asks for lie there.
uint64_t get_bits(const uint8_t* data, uint64_t size, uint64_t bit, unsigned w) {
  if (w == 0) return 0;
  if (w > 56) {
    return get_bits(data, size, bit, 32) | get_bits(data, size, bit + 32, w - 32) << 32;
  }
  const uint64_t byte = bit >> 3;
  uint64_t v = 0;
  if (byte + 8 <= size) {
    v = load_le64(data + byte);
  } else {
    for (uint64_t b = byte, s = 0; b < size && s < 64; ++b, s += 8) v |= uint64_t{data[b]} << s;
  }
  return (v >> (bit & 7)) & ((uint64_t{1} << w) - 1);
}

class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  void put(uint64_t v, unsigned w) {
    if (w > 32) {
      put(v & 0xffffffffu, 32);
      put(v >> 32, w - 32);
      return;
    }
    acc_ |= (v & ((uint64_t{1} << w) - 1)) << fill_;
    fill_ += w;
    for (; fill_ >= 8; fill_ -= 8, acc_ >>= 8) out_.push_back(static_cast<char>(acc_ & 0xff));
  }
  // Pads the last byte with zero bits.
  void finish() {
    if (fill_ > 0) out_.push_back(static_cast<char>(acc_ & 0xff));
    acc_ = 0;
    fill_ = 0;
  }

 private:
  std::string& out_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// The largest p in [lo, hi] with C(p, j) <= r, given C(lo, j) <= r < C(hi + 1, j). Small j start
// from the inverse of C(p, j) ~ (p - (j - 1) / 2)^j / j!, which is within a step or two; the
// integer comparisons alone decide the answer, so rounding in the guess cannot change it.
template <class Binomial>
uint64_t largest_at_most(const Binomial& C, uint64_t r, uint64_t j, uint64_t lo, uint64_t hi) {
  if (j <= 6) {
    static constexpr double kFactorial[] = {1, 1, 2, 6, 24, 120, 720};
    const double x = static_cast<double>(r) * kFactorial[j];
    const double root = j == 2   ? std::sqrt(x)
                        : j == 3 ? std::cbrt(x)
                        : j == 4 ? std::sqrt(std::sqrt(x))
                                 : std::pow(x, 1.0 / static_cast<double>(j));
    const double guess = root + 0.5 * static_cast<double>(j - 1);
    uint64_t p = guess <= static_cast<double>(lo)   ? lo
                 : guess >= static_cast<double>(hi) ? hi
                                                    : static_cast<uint64_t>(guess);
    while (p < hi && C(p + 1, j) <= r) ++p;
    while (C(p, j) > r) --p;
    return p;
  }
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
  for (uint64_t c = 0; c < chunks; ++c) {
    uint64_t r = get_bits(data, size, c * width, width);
    if (r >= count) {
      fail("{}: the position rank of chunk {} is {} (allowed: < C({}, {}) = {})", where, c, r, n, k,
           count);
    }
    // Greedy inversion of r = sum_i C(p_i, i + 1): the residual after p_i is below C(p_i, i),
    // so each p_{i-1} lands below p_i and the set is ascending and in range by construction.
    uint32_t* out = positions + c * k;
    uint64_t hi = n - 1;
    uint64_t i = k;
    while (i > 0 && r > 0) {
      --i;
      const uint64_t p = i == 0 ? r : largest_at_most(C, r, i + 1, i, hi);
      out[i] = static_cast<uint32_t>(p);
      r -= i == 0 ? p : C(p, i + 1);
      hi = p - 1;
    }
    // A zero residual leaves the smallest positions: C(p, i + 1) = 0 exactly for p <= i.
    while (i > 0) {
      --i;
      out[i] = static_cast<uint32_t>(i);
    }
  }
}

void decode_elias_fano(const uint8_t* data, uint64_t size, uint64_t chunks, uint64_t n,
                       uint64_t k, unsigned low, uint64_t chunk_bits, uint32_t* positions,
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
    uint64_t i = 0;
    for (uint64_t offset = 0; offset < high_bits; offset += 64) {
      const auto w = static_cast<unsigned>(std::min<uint64_t>(64, high_bits - offset));
      for (uint64_t word = get_bits(data, size, bitmap + offset, w); word != 0;
           word &= word - 1) {
        if (i == k) {
          fail("{}: the Elias-Fano bitmap of chunk {} has more than {} bits set (allowed: exactly "
               "{}, one per position)",
               where, c, k, k);
        }
        const uint64_t high = offset + static_cast<uint64_t>(std::countr_zero(word)) - i;
        const uint64_t p = high > max_high ? n : (high << low | out[i]);
        if (p >= n) {
          fail("{}: position {} of chunk {} is out of range (high part {}, low part {}; allowed: "
               "< {})",
               where, i, c, high, out[i], n);
        }
        if (i > 0 && p <= out[i - 1]) {
          fail("{}: positions in chunk {} are not strictly ascending ({} follows {})", where, c, p,
               out[i - 1]);
        }
        out[i++] = static_cast<uint32_t>(p);
      }
    }
    if (i != k) {
      fail("{}: the Elias-Fano bitmap of chunk {} has {} bits set (allowed: exactly {}, one per "
           "position)",
           where, c, i, k);
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
  BitWriter writer(out);
  if (kind_ == Kind::kRank) {
    const auto table = table_for(n_, k_);
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
    if (const auto table = table_for(n_, k_)) {
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
    fail("{}: the padding bits after the last chunk's positions are not 0 (byte 0x{:02x}, {} bits "
         "used)",
         where, data[size - 1], used);
  }
}

}  // namespace agora
