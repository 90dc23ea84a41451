// Position code: how a dct_topk tensor's top-k positions are written in payload version 2
// (payload.h has the whole format; docs/algorithms.md section 1.9 says why this code).
//
// A chunk of n coefficients sends k distinct positions, ascending. There are C(n, k) such sets,
// so log2 C(n, k) bits are the least any code can use; fixed-width integers (version 1) spent
// k * 16 bits at n = 4096 where 44 suffice for k = 4. Each chunk gets the same number of bits,
// fixed by (n, k) alone, so a layout still fixes the payload's exact size:
//
//   rank         when C(n, k) < 2^64: the set's rank in the combinatorial number system,
//                r = sum_i C(p_i, i + 1) over the ascending positions p_0 < ... < p_{k-1}, in
//                W = bit_width(C(n, k) - 1) bits (0 when C(n, k) = 1, i.e. k = n). Optimal.
//   elias_fano   otherwise (large k: top-k 32 of 4096 needs 266 bits, more than a u64): with
//                L = the low-bit width minimising k * L + k + ((n - 1) >> L) (the smallest such
//                L), the k low parts p_i & (2^L - 1), L bits each, then a bitmap of
//                k + ((n - 1) >> L) bits with bit (p_i >> L) + i set for each i and no other.
//
// Every chunk's bits follow the previous chunk's with no gap, least significant bit first (bit b
// of the stream is bit b % 8 of byte b / 8, as with one-bit values); a value of w bits is written
// least significant bit first. Bits after the last chunk up to the byte boundary are 0.
//
// Canonical: each set has one encoding, and decoding refuses every bit string that is not one: a
// rank >= C(n, k), a bitmap without exactly k bits set, an Elias-Fano position >= n or not above
// the one before, or a padding bit set. Decoding is integer arithmetic only (a floating-point
// first guess speeds up finding each position, and an exact integer check decides it), so it is
// identical on every machine.
//
// Memory: binomial tables C(p, j) for p <= n, 1 <= j <= k, built on first use for a rank code with
// (n + 1) * k <= 2^20 entries (8 MiB), are cached process-wide, at most 4 of them (the oldest
// dropped first), so a decoder holds at most 32 MiB of them whatever it is fed. Decoding builds
// one only for at least (n + 1) / 64 chunks, so its cost is bounded by the work of the decode
// itself; otherwise, and for larger (n, k), binomials are computed as they go, slower but in
// constant memory, with the same results.
//
// Torch-free, thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace agora {

class PositionCode {
 public:
  enum class Kind : uint8_t { kRank, kEliasFano };

  // n = chunk size (1 to 2^32), k = topk (1 to n); the caller has checked both. Cheap: tables
  // are looked up when encoding or decoding.
  PositionCode(uint64_t n, uint64_t k);

  Kind kind() const { return kind_; }
  uint64_t chunk_bits() const { return chunk_bits_; }
  // Bytes of `chunks` chunks' positions, padding included.
  uint64_t bytes(uint64_t chunks) const { return (chunks * chunk_bits_ + 7) / 8; }
  uint32_t low_bits() const { return low_bits_; }  // elias_fano's L
  uint64_t set_count() const { return count_; }    // rank: C(n, k)

  // Appends bytes(chunks) bytes; `positions` holds chunks * k valid positions, each chunk's
  // strictly ascending below n (the caller has checked).
  void encode(const uint32_t* positions, uint64_t chunks, std::string& out) const;

  // Reads bytes(chunks) bytes at `data` into chunks * k positions, each chunk's strictly
  // ascending below n, or throws Error naming `where`, the chunk, the field and what is allowed.
  void decode(const uint8_t* data, uint64_t chunks, uint32_t* positions,
              const std::string& where) const;

 private:
  uint64_t n_, k_;
  Kind kind_;
  uint32_t low_bits_ = 0;
  uint64_t count_ = 0;
  uint64_t chunk_bits_ = 0;
};

// C(n, k) when it is below 2^64, else 2^64 (saturated); 0 when k > n.
unsigned __int128 binomial_saturated(uint64_t n, uint64_t k);

}  // namespace agora
