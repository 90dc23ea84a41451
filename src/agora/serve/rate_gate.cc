#include "agora/serve/rate_gate.h"

#include <iterator>

namespace agora::serve {

RateGate::Bucket& RateGate::bucket_of(const std::string& key, double now) {
  if (const auto it = buckets_.find(key); it != buckets_.end()) return it->second;
  if (buckets_.size() >= max_tracked_) {
    std::erase_if(buckets_, [&](const auto& item) {
      return item.second.dropped == 0 &&
             item.second.tokens.full(member_.per_second, member_.burst, now);
    });
    if (buckets_.size() >= max_tracked_) {
      buckets_.clear();  // every tracked key is busy: start over rather than grow (their
                         // unreported drops stay in dropped_total_)
    }
  }
  return buckets_[key];
}

bool RateGate::take(const std::string& key, bool member, double now) {
  Bucket& b = member ? bucket_of(key, now) : strangers_;
  const Rate& rate = member ? member_ : strangers_rate_;
  if (b.tokens.take(rate.per_second, rate.burst, now)) return true;
  ++b.dropped;
  ++dropped_total_;
  return false;
}

void RateGate::forget_if(const std::function<bool(const std::string& key)>& gone) {
  std::erase_if(buckets_, [&](const auto& item) { return gone(item.first); });
}

std::vector<RateGate::Dropped> RateGate::report(double now) {
  std::vector<Dropped> out;
  if (strangers_.dropped > 0) out.push_back({"", strangers_.dropped});
  strangers_.dropped = 0;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (it->second.dropped > 0) out.push_back({it->first, it->second.dropped});
    it->second.dropped = 0;
    it = it->second.tokens.full(member_.per_second, member_.burst, now) ? buckets_.erase(it)
                                                                        : std::next(it);
  }
  return out;
}

}  // namespace agora::serve
