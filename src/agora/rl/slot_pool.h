// SlotPool: which rollout worker answers which (problem, sample) of the learner's open step.
//
// A step asks for a group of `group_size` completions of each of its problems: that many slots
// per problem. Workers ask for work and get free slots; a slot is filled by the first rollout
// for it that passes the learner's checks. The learner, not the worker, chooses the problems
// and the samples, so a worker can neither pick the problems it answers (nor the held-out ones)
// nor flood a group: a rollout for a slot it was not handed is refused as unassigned.
//
// Slots handed out and not filled within `reassign_seconds` are handed again, to whoever asks
// next (a worker that died, or is slow, delays the step by at most that); the first holder may
// still fill it, but its overdue slots no longer count against what it may hold, so a worker
// that restarts gets work at once. A slot is never handed again to a worker that answered it
// (the learner says so with answered(): a second rollout of the same slot would be struck as a
// resubmission), and at most `max_handouts` times in all; a worker whose answer was lost on the
// way may get its slot again. Each worker holds at most `max_slots_per_worker` slots that are not overdue. Memory is
// bounded by what the learner opened: slots x max_handouts names.
//
// Decisions depend only on the calls and the times given, never on a clock: tests drive it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace agora {

struct SlotPoolOptions {
  uint32_t group_size = 8;
  double reassign_seconds = 20;
  uint32_t max_slots_per_worker = 64;
  uint32_t max_handouts = 8;  // per slot, in all
};

struct SlotId {
  uint64_t problem = 0;
  uint32_t sample = 0;
  auto operator<=>(const SlotId&) const = default;
};

class SlotPool {
 public:
  explicit SlotPool(SlotPoolOptions options);

  // A new step: `problems`' slots, all free; the previous step's are forgotten.
  void open(const std::vector<uint64_t>& problems);

  // Up to `want` slots for `worker` (capped by what it may still hold): free ones first, in
  // (problem, sample) order, then overdue ones, oldest hand-out first; never one it answered.
  std::vector<SlotId> hand_out(const std::string& worker, uint32_t want, double now);

  // Whether `slot` is open, unfilled and held by `worker` (overdue or not).
  bool held_by(const std::string& worker, SlotId slot) const;
  void fill(SlotId slot);
  // The checks failed for the rollout `worker` sent for `slot`: it no longer holds it, and the
  // slot is free again (for others) if nobody else does.
  void release(const std::string& worker, SlotId slot);
  // `worker`, a holder of `slot`, sent a rollout for it that the learner recorded: never hand it
  // this slot again.
  void answered(const std::string& worker, SlotId slot);
  // A banned, departed or restarted worker's unfilled slots go back to the pool.
  void forget(const std::string& worker);

  size_t size() const { return slots_.size(); }
  size_t filled() const { return filled_; }
  bool complete() const { return filled_ == slots_.size(); }
  // Unfilled slots `worker` holds that are not overdue at `now`.
  uint32_t holding(const std::string& worker, double now) const;

 private:
  struct Slot {
    bool filled = false;
    std::vector<std::pair<std::string, double>> holders;  // (worker, handed at)
    std::vector<std::string> answered;                    // workers that answered it
    uint32_t handouts = 0;
    double latest() const;                                // the newest hand-out; 0: none
  };
  SlotPoolOptions options_;
  std::map<SlotId, Slot> slots_;
  size_t filled_ = 0;
};

}  // namespace agora
