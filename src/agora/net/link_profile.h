// LinkProfile: how one direction of an emulated link behaves (bandwidth, delay, jitter, loss),
// and the compact spec users write it in ("rate=20mbit,delay=50ms,loss=1%"). LinkShaper
// (link_shaper.h) applies it; `agora link --profile` and bench/network parse it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace agora::net {

// How one direction of a link behaves. The defaults are a perfect link: unlimited, no delay.
struct LinkProfile {
  double bandwidth_bits_per_second = 0;  // 0 = unlimited; otherwise >= 8 (one byte a second)
  double delay_seconds = 0;              // one way, added to every byte; [0, 3600]
  double jitter_seconds = 0;             // uniform extra delay in [0, jitter]; [0, 3600]
  double loss = 0;                       // probability a segment is lost; [0, 1)
  uint64_t seed = 0;                     // keys the jitter and loss draws
};

// Throws Error naming the field, its value and the allowed range when a field is negative,
// NaN, infinite or out of range.
void validate(const LinkProfile& profile);

// Parses a compact spec such as "rate=20mbit,delay=50ms,jitter=5ms,loss=1%,seed=7".
//   rate    a number and bit, kbit, mbit or gbit (per second, decimal: 1 kbit = 1000 bit; an
//           optional "/s" may follow); 0 or "unlimited" for no limit
//   delay, jitter   a number and s, ms or us
//   loss    a percentage ("1%") or a fraction ("0.01")
//   seed    an unsigned integer
// Keys may come in any order, each at most once; omitted keys keep LinkProfile's defaults; ""
// and "none" give the perfect link. The result is validated. Throws Error naming the bad part
// and what is allowed.
LinkProfile parse_link_profile(std::string_view spec);

// The profile in the syntax parse_link_profile reads, e.g. "rate=20mbit,delay=50ms,loss=1%".
std::string to_string(const LinkProfile& profile);

}  // namespace agora::net
