// TokenBucket: at most `rate` events a second on average, `burst` at once.
//
// Every queue keyed by what a peer sends needs a rate as well as a size: a member that sends ten
// thousand requests a second must not take the serving thread from the others. A bucket starts
// full; take() refills it for the time since the last call and spends one token, or refuses.
// Times are seconds on any monotonic clock; a bucket never calls the clock itself, so tests
// drive it with made-up times.
#pragma once

#include <algorithm>

namespace agora {

struct TokenBucket {
  double tokens = 0, last = 0;
  bool started = false;

  bool take(double rate, double burst, double now) {
    if (!started) {
      tokens = burst;
      last = now;
      started = true;
    }
    tokens = std::min(burst, tokens + std::max(0.0, now - last) * rate);
    last = std::max(last, now);
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  }

  // Whether the bucket would be full at `now`: the same as a fresh one, so a map of buckets may
  // forget it.
  bool full(double rate, double burst, double now) const {
    return !started || tokens + std::max(0.0, now - last) * rate >= burst;
  }
};

}  // namespace agora
