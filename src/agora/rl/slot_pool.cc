#include "agora/rl/slot_pool.h"

#include <algorithm>

#include "agora/core/error.h"

namespace agora {

SlotPool::SlotPool(SlotPoolOptions options) : options_(options) {
  if (options_.group_size < 1) fail("rl slot pool: group size 0 (allowed: >= 1)");
  if (options_.max_handouts < 1) fail("rl slot pool: max handouts 0 (allowed: >= 1)");
}

double SlotPool::Slot::latest() const {
  double t = 0;
  for (const auto& [worker, at] : holders) t = std::max(t, at);
  return t;
}

void SlotPool::open(const std::vector<uint64_t>& problems) {
  slots_.clear();
  filled_ = 0;
  for (uint64_t p : problems) {
    for (uint32_t s = 0; s < options_.group_size; ++s) slots_[{p, s}];
  }
}

uint32_t SlotPool::holding(const std::string& worker, double now) const {
  uint32_t n = 0;
  for (const auto& [id, slot] : slots_) {
    if (slot.filled) continue;
    for (const auto& [holder, at] : slot.holders) {
      if (holder == worker && now - at < options_.reassign_seconds) ++n;
    }
  }
  return n;
}

std::vector<SlotId> SlotPool::hand_out(const std::string& worker, uint32_t want, double now) {
  const uint32_t held = holding(worker, now);
  want = std::min(want, held >= options_.max_slots_per_worker
                            ? 0u
                            : options_.max_slots_per_worker - held);
  const auto may_take = [&](const Slot& slot) {
    if (slot.filled || slot.handouts >= options_.max_handouts) return false;
    return std::find(slot.answered.begin(), slot.answered.end(), worker) == slot.answered.end();
  };
  std::vector<SlotId> out;
  const auto give = [&](const SlotId& id, Slot& slot) {
    // An overdue holder that never answered may get its slot again (its answer was lost).
    std::erase_if(slot.holders, [&](const auto& h) { return h.first == worker; });
    slot.holders.emplace_back(worker, now);
    ++slot.handouts;
    out.push_back(id);
  };
  for (auto& [id, slot] : slots_) {
    if (out.size() >= want) return out;
    if (slot.holders.empty() && may_take(slot)) give(id, slot);
  }
  std::vector<std::pair<double, SlotId>> overdue;
  for (const auto& [id, slot] : slots_) {
    if (!slot.holders.empty() && may_take(slot) &&
        now - slot.latest() >= options_.reassign_seconds) {
      overdue.emplace_back(slot.latest(), id);
    }
  }
  std::sort(overdue.begin(), overdue.end());
  for (const auto& [at, id] : overdue) {
    if (out.size() >= want) break;
    give(id, slots_.at(id));
  }
  return out;
}

bool SlotPool::held_by(const std::string& worker, SlotId id) const {
  const auto it = slots_.find(id);
  if (it == slots_.end() || it->second.filled) return false;
  for (const auto& [holder, at] : it->second.holders) {
    if (holder == worker) return true;
  }
  return false;
}

void SlotPool::fill(SlotId id) {
  const auto it = slots_.find(id);
  if (it == slots_.end() || it->second.filled) return;
  it->second.filled = true;
  it->second.holders.clear();
  ++filled_;
}

void SlotPool::release(const std::string& worker, SlotId id) {
  const auto it = slots_.find(id);
  if (it == slots_.end() || it->second.filled) return;
  std::erase_if(it->second.holders, [&](const auto& h) { return h.first == worker; });
}

void SlotPool::answered(const std::string& worker, SlotId id) {
  const auto it = slots_.find(id);
  if (it == slots_.end()) return;
  auto& answered = it->second.answered;
  if (std::find(answered.begin(), answered.end(), worker) == answered.end() &&
      answered.size() < options_.max_handouts) {
    answered.push_back(worker);
  }
}

void SlotPool::forget(const std::string& worker) {
  for (auto& [id, slot] : slots_) {
    if (!slot.filled) std::erase_if(slot.holders, [&](const auto& h) { return h.first == worker; });
  }
}

}  // namespace agora
