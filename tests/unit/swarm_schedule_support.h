// The hand-driven swarm of the schedule's tests (swarm_schedule_test, swarm_deadlines_test):
// made-up keys, hashes and endpoints, and the steps every test takes.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agora/swarm/schedule.h"

namespace agora::swarm_test {

inline std::string key(int i) {
  return std::string(32, static_cast<char>('a' + i));
}
inline std::string hash(int i) {
  return std::string(32, static_cast<char>('A' + i));
}
inline std::string endpoint(int i) {
  return "tcp://127.0.0.1:" + std::to_string(9000 + i);
}

inline SwarmScheduleOptions options(int64_t stages = 2, int64_t micro_batches = 4) {
  SwarmScheduleOptions o;
  o.stages = stages;
  o.steps = 3;
  o.micro_batches = micro_batches;
  o.micro_batch_size = 2;
  o.start_peers = 1;
  o.peer_timeout = 5;
  o.max_hold = 3;
  return o;
}

// A peer's report of holding `stage` at `version` with `h`.
inline SwarmReport ready(int64_t stage, uint64_t version, const std::string& h = hash(0)) {
  SwarmReport r;
  r.stage = stage;
  r.version = version;
  r.state_hash = h;
  r.ready = true;
  return r;
}

// Joins peers 0..n-1 on the given stages, all ready at step 0, and starts the run.
inline void start(SwarmSchedule& s, const std::vector<int64_t>& stages, double now = 0) {
  for (size_t i = 0; i < stages.size(); ++i) {
    ASSERT_TRUE(s.hello(key(static_cast<int>(i)), endpoint(static_cast<int>(i)), stages[i], now)
                    .refused.empty());
    s.poll(key(static_cast<int>(i)), ready(stages[i], 0), now);
  }
  s.tick(now);
}

// Runs the step's micro-batches through stage-0 peer `origin`: asks, reports them all done.
inline void train_step(SwarmSchedule& s, int origin, uint64_t step, double now, int64_t M = 4) {
  SwarmReport r = ready(0, step);
  r.wants = M;
  std::vector<uint32_t> given;
  while (static_cast<int64_t>(given.size()) < M) {
    const SwarmAnswer a = s.poll(key(origin), r, now);
    ASSERT_FALSE(a.micro_batches.empty()) << "nothing handed out";
    r.done.clear();
    for (uint32_t j : a.micro_batches) {
      given.push_back(j);
      r.done.emplace_back(j, 5.0f);
    }
  }
  s.poll(key(origin), r, now);
}

// Every peer i (on stages[i], at step 0) sends its contribution to step 0's round.
inline void contribute_all(SwarmSchedule& s, const std::vector<int64_t>& stages, double now) {
  for (size_t i = 0; i < stages.size(); ++i) {
    SwarmReport r = ready(stages[i], 0);
    r.payload = "x" + std::to_string(i);
    s.poll(key(static_cast<int>(i)), r, now);
  }
}

}  // namespace agora::swarm_test
