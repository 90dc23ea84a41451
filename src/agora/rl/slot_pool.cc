#include "agora/rl/slot_pool.h"

#include <algorithm>

#include "agora/core/error.h"

namespace agora {

SlotPool::SlotPool(SlotPoolOptions options) : options_(options) {
  if (options_.group_size < 1) fail("rl slot pool: group size 0 (allowed: >= 1)");
  if (options_.max_holders < 1) fail("rl slot pool: max holders 0 (allowed: >= 1)");
}

void SlotPool::open(const std::vector<uint64_t>& problems) {
  slots_.clear();
  filled_ = 0;
  for (uint64_t p : problems) {
    for (uint32_t s = 0; s < options_.group_size; ++s) slots_[{p, s}];
  }
}

uint32_t SlotPool::holding(const std::string& worker) const {
  uint32_t n = 0;
  for (const auto& [id, slot] : slots_) {
    if (!slot.filled && std::find(slot.holders.begin(), slot.holders.end(), worker) !=
                            slot.holders.end()) {
      ++n;
    }
  }
  return n;
}

std::vector<SlotId> SlotPool::hand_out(const std::string& worker, uint32_t want, double now) {
  const uint32_t held = holding(worker);
  const uint32_t room = held >= options_.max_slots_per_worker
                            ? 0
                            : options_.max_slots_per_worker - held;
  want = std::min(want, room);
  std::vector<SlotId> out;
  const auto give = [&](const SlotId& id, Slot& slot) {
    slot.holders.push_back(worker);
    slot.handed_at = now;
    out.push_back(id);
  };
  for (auto& [id, slot] : slots_) {
    if (out.size() >= want) return out;
    if (!slot.filled && slot.holders.empty()) give(id, slot);
  }
  std::vector<std::pair<double, SlotId>> overdue;
  for (const auto& [id, slot] : slots_) {
    const bool holds =
        std::find(slot.holders.begin(), slot.holders.end(), worker) != slot.holders.end();
    if (!slot.filled && !slot.holders.empty() && !holds &&
        slot.holders.size() < options_.max_holders &&
        now - slot.handed_at >= options_.reassign_seconds) {
      overdue.emplace_back(slot.handed_at, id);
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
  const auto& holders = it->second.holders;
  return std::find(holders.begin(), holders.end(), worker) != holders.end();
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
  auto& holders = it->second.holders;
  holders.erase(std::remove(holders.begin(), holders.end(), worker), holders.end());
}

void SlotPool::forget(const std::string& worker) {
  for (auto& [id, slot] : slots_) {
    if (!slot.filled) {
      slot.holders.erase(std::remove(slot.holders.begin(), slot.holders.end(), worker),
                         slot.holders.end());
    }
  }
}

}  // namespace agora
