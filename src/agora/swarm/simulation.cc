#include "agora/swarm/simulation.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <random>

#include "agora/core/error.h"
#include "agora/swarm/balance.h"
#include "agora/swarm/router.h"

namespace agora {
namespace {

constexpr int64_t kSource = -1;     // the sender of every stage-0 forward
constexpr double kWaitSeconds = 1;  // a sender with no replica to send to looks again after this

enum class Work { kForward = 1, kBackward = 2, kBoth = 3 };  // the value: cost in forwards

enum class Kind { kArrive, kDone, kRetry, kRecover, kLost, kKill, kForget, kRestart, kJoined,
                  kRebalance, kWindow };

struct Event {
  double time = 0;
  uint64_t seq = 0;  // ties go in the order events were scheduled
  Kind kind = Kind::kWindow;
  int64_t mb = -1, peer = -1, stage = -1;
  uint64_t replica = 0, other = 0;  // the replica it concerns; a sender's own replica or a failed one
  Work work = Work::kForward;
  bool operator>(const Event& e) const { return time != e.time ? time > e.time : seq > e.seq; }
};

struct Task {
  int64_t mb = -1;
  Work work = Work::kForward;
};

// One stage of a micro-batch's route: the replica it went through and whether that replica still
// waits for its backward (it holds the activations until then).
struct Hop {
  int64_t peer = 0;
  uint64_t replica = 0;
  bool owes = false;
};

struct MicroBatch {
  std::vector<Hop> path;
  bool alive = true;
};

// The stage at which a micro-batch went through a replica.
int64_t hop_of(const MicroBatch& m, uint64_t replica) {
  for (size_t s = 0; s < m.path.size(); ++s) {
    if (m.path[s].replica == replica) return static_cast<int64_t>(s);
  }
  return -1;
}

// kServing takes new micro-batches; kDraining (moving) only finishes what it holds; kLoading
// fetches a stage's parameters; kDown is dead until its restart.
enum class State { kServing, kDraining, kLoading, kDown };

struct Peer {
  double speed = 1;
  int64_t stage = 0, home_stage = 0, move_to = -1;
  State state = State::kServing;
  uint64_t replica = 0;      // its identity while it serves a stage; 0 otherwise
  uint64_t incarnation = 0;  // bumped at each death and each move, so stale events are dropped
  std::deque<Task> forward, backward;
  bool busy = false;
  Task current;
  double current_seconds = 0;          // what the current task takes
  int64_t owed = 0;                    // backwards still to come for forwards it did
  double average = 0;                  // its seconds per sample on its stage (EMA, alpha 0.1)
  int64_t measured = 0;
  std::unique_ptr<SwarmRouter> router;  // over the next stage
};

class Simulation {
 public:
  explicit Simulation(const SwarmSimOptions& o) : o_(o), rng_(o.seed) {}

  SwarmSimSummary run();

 private:
  void schedule(Event e) {
    e.seq = seq_++;
    events_.push(e);
  }
  double uniform01() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  int64_t stages() const { return static_cast<int64_t>(costs_.size()); }
  bool holds(int64_t peer, uint64_t replica) const {
    const Peer& p = peers_[peer];
    return replica != 0 && p.replica == replica &&
           (p.state == State::kServing || p.state == State::kDraining);
  }
  double estimate(const Peer& p) const {
    return p.measured == 0 ? 0 : p.average / (1 - std::pow(0.9, static_cast<double>(p.measured)));
  }
  SwarmRouter* router_of(int64_t sender) {
    return sender == kSource ? source_.get() : peers_[sender].router.get();
  }
  std::vector<int64_t> senders_to(int64_t stage) const;
  std::unique_ptr<SwarmRouter> make_router(uint64_t salt) const;
  double ideal_now() const;

  void start_micro_batch(double now);
  void route_forward(int64_t mb, int64_t sender, double now);
  void send(int64_t mb, uint64_t replica, Work work, double now);
  void try_start(int64_t peer, double now);
  void maybe_leave(int64_t peer, double now);
  void lose(int64_t mb, double now);
  void resend_forward(int64_t mb, uint64_t failed, double when);
  void on_retry(const Event& e);
  void on_recover(const Event& e);
  void join(int64_t peer);

  void on_arrive(const Event& e);
  void on_done(const Event& e);
  void on_kill(double now);
  void on_rebalance(double now);

  SwarmSimOptions o_;
  std::vector<double> costs_;
  std::vector<Peer> peers_;
  std::vector<MicroBatch> mbs_;
  std::map<uint64_t, int64_t> owner_;  // replica -> peer
  std::unique_ptr<SwarmRouter> source_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::mt19937_64 rng_;
  uint64_t seq_ = 0, next_replica_ = 1;
  SwarmSimSummary s_;
  int64_t window_samples_ = 0;
  double ideal_integral_ = 0, window_ideal_ = 0;
};

std::vector<int64_t> Simulation::senders_to(int64_t stage) const {
  std::vector<int64_t> out;
  if (stage == 0) return {kSource};
  for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
    if (holds(i, peers_[i].replica) && peers_[i].stage == stage - 1) out.push_back(i);
  }
  return out;
}

std::unique_ptr<SwarmRouter> Simulation::make_router(uint64_t salt) const {
  SwarmRouterOptions ro;
  ro.uniform = o_.uniform;
  ro.backlog = o_.backlog;
  ro.seed = o_.seed * 0x9e3779b97f4a7c15ULL + salt;
  ro.skip_seconds = o_.timeout_seconds;
  // Before any replica of the next stage reports, a sender assumes a reference machine.
  ro.prior_seconds_per_sample = 3 * *std::max_element(costs_.begin(), costs_.end());
  return std::make_unique<SwarmRouter>(ro);
}

double Simulation::ideal_now() const {
  std::vector<double> tp(costs_.size(), 0.0);
  for (const Peer& p : peers_) {
    if (p.state == State::kServing) tp[p.stage] += p.speed / (3 * costs_[p.stage]);
  }
  return *std::min_element(tp.begin(), tp.end());
}

void Simulation::start_micro_batch(double now) {
  mbs_.push_back(MicroBatch{});
  route_forward(static_cast<int64_t>(mbs_.size()) - 1, kSource, now);
}

// The sender (kSource or the replica that ran the previous stage) picks the next stage's replica.
void Simulation::route_forward(int64_t mb, int64_t sender, double now) {
  const std::optional<uint64_t> to = router_of(sender)->pick(o_.micro_batch, now);
  if (!to) {  // nobody serves the next stage: wait for a joiner
    schedule({.time = now + kWaitSeconds, .kind = Kind::kRetry, .mb = mb, .peer = sender,
              .other = sender == kSource ? 0 : peers_[sender].replica});
    return;
  }
  const bool last = static_cast<int64_t>(mbs_[mb].path.size()) == stages() - 1;
  mbs_[mb].path.push_back(Hop{owner_.at(*to), *to, false});
  send(mb, *to, last ? Work::kBoth : Work::kForward, now);
}

void Simulation::send(int64_t mb, uint64_t replica, Work work, double now) {
  schedule({.time = now + o_.link_seconds, .kind = Kind::kArrive, .mb = mb, .replica = replica,
            .work = work});
}

void Simulation::try_start(int64_t peer, double now) {
  Peer& p = peers_[peer];
  if (p.busy || !holds(peer, p.replica)) return;
  std::deque<Task>& q = !p.backward.empty() ? p.backward : p.forward;
  if (q.empty()) return;
  p.current = q.front();
  q.pop_front();
  p.busy = true;
  const double work = static_cast<double>(static_cast<int>(p.current.work));
  const double seconds = static_cast<double>(o_.micro_batch) * costs_[p.stage] * work / p.speed *
                         (1 + o_.jitter * (2 * uniform01() - 1));
  p.current_seconds = seconds;
  schedule({.time = now + seconds, .kind = Kind::kDone, .peer = peer, .replica = p.replica});
}

// A moving peer leaves its stage once it holds nothing and is owed nothing.
void Simulation::maybe_leave(int64_t peer, double now) {
  Peer& p = peers_[peer];
  if (p.state != State::kDraining || p.busy || !p.forward.empty() || !p.backward.empty() ||
      p.owed > 0) {
    return;
  }
  p.state = State::kLoading;
  p.replica = 0;
  p.stage = p.move_to;
  p.move_to = -1;
  p.router.reset();
  p.average = 0;
  p.measured = 0;
  schedule({.time = now + o_.join_seconds, .kind = Kind::kJoined, .peer = peer,
            .other = p.incarnation});
}

void Simulation::lose(int64_t mb, double now) {
  MicroBatch& m = mbs_[mb];
  if (!m.alive) return;
  m.alive = false;
  ++s_.lost;
  for (Hop& h : m.path) {
    if (h.owes && holds(h.peer, h.replica)) {
      --peers_[h.peer].owed;
      maybe_leave(h.peer, now);
    }
    h.owes = false;
  }
  schedule({.time = now + o_.timeout_seconds, .kind = Kind::kLost, .mb = mb});
}

// The sender of a forward that went to a dead replica still holds its input: it notices the
// silence at `when`, skips that replica and sends the micro-batch to another.
void Simulation::resend_forward(int64_t mb, uint64_t failed, double when) {
  MicroBatch& m = mbs_[mb];
  m.path.pop_back();
  const int64_t sender = m.path.empty() ? kSource : m.path.back().peer;
  schedule({.time = when, .kind = Kind::kRetry, .mb = mb, .peer = sender, .replica = failed,
            .other = sender == kSource ? 0 : m.path.back().replica});
}

void Simulation::on_retry(const Event& e) {
  if (!mbs_[e.mb].alive) return;
  if (e.peer != kSource && !holds(e.peer, e.other)) {  // the sender died holding the input
    lose(e.mb, e.time);
    return;
  }
  if (e.replica != 0) {
    router_of(e.peer)->failed(e.replica, e.time);
    ++s_.retries;
  }
  route_forward(e.mb, e.peer, e.time);
}

// A replica died holding the activations a micro-batch's backward needs at `stage`. The replica
// before it still holds that stage's input, and the gradient waits at the stage after: another
// replica of the stage runs the forward again and the backward (SWARM's recovery), and the
// backward goes on from there. Without the input (its holder died too) the micro-batch is lost.
void Simulation::on_recover(const Event& e) {
  MicroBatch& m = mbs_[e.mb];
  if (!m.alive) return;
  const int64_t s = e.stage;
  if (s < 0 || s >= static_cast<int64_t>(m.path.size())) {  // not on its path: nothing to redo
    lose(e.mb, e.time);
    return;
  }
  const int64_t holder = s == 0 ? kSource : m.path[s - 1].peer;
  if (holder != kSource && !holds(holder, m.path[s - 1].replica)) {
    lose(e.mb, e.time);
    return;
  }
  SwarmRouter* router = router_of(holder);
  if (router->contains(m.path[s].replica) && !holds(m.path[s].peer, m.path[s].replica)) {
    router->failed(m.path[s].replica, e.time);
  }
  const std::optional<uint64_t> to = router->pick(o_.micro_batch, e.time);
  if (!to) {  // nobody serves the stage: wait for a joiner
    schedule({.time = e.time + kWaitSeconds, .kind = Kind::kRecover, .mb = e.mb, .stage = s});
    return;
  }
  m.path[s] = Hop{owner_.at(*to), *to, false};
  ++s_.recomputed;
  send(e.mb, *to, Work::kBoth, e.time);
}

void Simulation::join(int64_t peer) {
  Peer& p = peers_[peer];
  p.state = State::kServing;
  p.replica = next_replica_++;
  owner_[p.replica] = peer;
  if (p.stage + 1 < stages()) {
    p.router = make_router(p.replica);
    for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
      if (peers_[i].state == State::kServing && peers_[i].stage == p.stage + 1) {
        p.router->add(peers_[i].replica);
      }
    }
  }
  for (int64_t sender : senders_to(p.stage)) router_of(sender)->add(p.replica);
}

void Simulation::on_arrive(const Event& e) {
  MicroBatch& m = mbs_[e.mb];
  if (!m.alive) return;
  const int64_t peer = owner_.at(e.replica);
  if (!holds(peer, e.replica)) {
    if (e.work == Work::kForward) {
      resend_forward(e.mb, e.replica, e.time + o_.timeout_seconds);
    } else {
      schedule({.time = e.time + o_.timeout_seconds, .kind = Kind::kRecover, .mb = e.mb,
                .stage = hop_of(m, e.replica)});
    }
    return;
  }
  Peer& p = peers_[peer];
  (e.work == Work::kBackward ? p.backward : p.forward).push_back(Task{e.mb, e.work});
  try_start(peer, e.time);
}

void Simulation::on_done(const Event& e) {
  Peer& p = peers_[e.peer];
  if (!p.busy || p.replica != e.replica) return;  // it died while computing
  p.busy = false;
  const Task t = p.current;
  const double seconds = p.current_seconds;
  p.average = 0.9 * p.average + 0.1 * seconds * 3 / static_cast<int>(t.work) /
                                    static_cast<double>(o_.micro_batch);
  ++p.measured;
  MicroBatch& m = mbs_[t.mb];
  const int64_t s = p.stage;
  if (m.alive) {
    if (t.work != Work::kBackward) {  // the answer carries the replica's own measurement
      const int64_t sender = s == 0 ? kSource : m.path[s - 1].peer;
      if (SwarmRouter* r = router_of(sender)) {
        r->answered(p.replica, o_.micro_batch, estimate(p) * static_cast<double>(o_.micro_batch));
      }
    }
    if (t.work == Work::kForward) {
      m.path[s].owes = true;
      ++p.owed;
      route_forward(t.mb, e.peer, e.time);
    } else {
      if (t.work == Work::kBackward) {
        m.path[s].owes = false;
        --p.owed;
      }
      if (s == 0) {
        m.alive = false;
        ++s_.micro_batches;
        window_samples_ += o_.micro_batch;
        start_micro_batch(e.time);
      } else {
        send(t.mb, m.path[s - 1].replica, Work::kBackward, e.time);
      }
    }
  }
  try_start(e.peer, e.time);
  maybe_leave(e.peer, e.time);
}

void Simulation::on_kill(double now) {
  std::vector<int64_t> alive;
  for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
    if (peers_[i].state != State::kDown) alive.push_back(i);
  }
  if (!alive.empty()) {
    const int64_t victim = alive[rng_() % alive.size()];
    Peer& p = peers_[victim];
    const uint64_t replica = p.replica;
    std::vector<Task> held(p.backward.begin(), p.backward.end());
    held.insert(held.end(), p.forward.begin(), p.forward.end());
    if (p.busy) held.push_back(p.current);
    p.state = State::kDown;
    p.replica = 0;
    ++p.incarnation;
    p.busy = false;
    p.forward.clear();
    p.backward.clear();
    p.owed = 0;
    p.move_to = -1;
    p.router.reset();
    p.average = 0;
    p.measured = 0;
    // What it held is redone elsewhere once its senders notice: a forward by its sender, a
    // backward (or a forward and backward) by a recovery at its stage.
    for (const Task& t : held) {
      if (!mbs_[t.mb].alive) continue;
      if (t.work == Work::kForward) {
        resend_forward(t.mb, replica, now + o_.timeout_seconds);
      } else {
        schedule({.time = now + o_.timeout_seconds, .kind = Kind::kRecover, .mb = t.mb,
                  .stage = hop_of(mbs_[t.mb], replica)});
      }
    }
    ++s_.kills;
    if (replica != 0) {
      schedule({.time = now + o_.timeout_seconds, .kind = Kind::kForget, .replica = replica});
    }
    schedule({.time = now + o_.restart_seconds, .kind = Kind::kRestart, .peer = victim,
              .other = p.incarnation});
  }
  schedule({.time = now + o_.kill_every, .kind = Kind::kKill});
}

// The coordinator's view: serving peers with what they measured, loading ones by their stage.
void Simulation::on_rebalance(double now) {
  std::vector<StagePeer> view;
  for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
    const Peer& p = peers_[i];
    if (p.state == State::kServing || p.state == State::kLoading) {
      view.push_back({static_cast<uint64_t>(i), p.stage,
                      p.state == State::kServing ? estimate(p) : 0.0});
    }
  }
  if (const std::optional<StageMove> move = plan_move(view, costs_, o_.min_gain)) {
    Peer& p = peers_[move->peer];
    for (int64_t sender : senders_to(p.stage)) router_of(sender)->remove(p.replica);
    p.state = State::kDraining;
    p.move_to = move->to;
    ++p.incarnation;
    ++s_.moves;
    maybe_leave(static_cast<int64_t>(move->peer), now);
  }
  schedule({.time = now + o_.rebalance_seconds, .kind = Kind::kRebalance});
}

SwarmSimSummary Simulation::run() {
  costs_ = o_.costs.empty() ? std::vector<double>(o_.speeds.size(), 1.0) : o_.costs;
  std::vector<StagePeer> all;
  for (int64_t s = 0; s < static_cast<int64_t>(o_.speeds.size()); ++s) {
    for (double v : o_.speeds[s]) {
      Peer p;
      p.speed = v;
      p.stage = p.home_stage = s;
      peers_.push_back(std::move(p));
      all.push_back({static_cast<uint64_t>(all.size()), s, 3 * costs_[s] / v});
    }
  }
  const std::vector<double> initial = stage_throughputs(all, costs_);
  s_.initial_bottleneck = *std::min_element(initial.begin(), initial.end());
  s_.best_bottleneck = best_bottleneck(all, costs_);
  source_ = make_router(0);
  // Last stage first, so that every router starts with the stage after it.
  for (int64_t s = stages() - 1; s >= 0; --s) {
    for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
      if (peers_[i].stage == s) join(i);
    }
  }
  const int64_t in_flight =
      o_.in_flight > 0 ? o_.in_flight : 4 * static_cast<int64_t>(peers_.size());
  for (int64_t i = 0; i < in_flight; ++i) start_micro_batch(0);
  if (o_.kill_every > 0) schedule({.time = o_.kill_every, .kind = Kind::kKill});
  if (o_.rebalance_seconds > 0) schedule({.time = o_.rebalance_seconds, .kind = Kind::kRebalance});
  schedule({.time = o_.window_seconds, .kind = Kind::kWindow});
  double last = 0, ideal = ideal_now(), window_start = 0;
  while (!events_.empty() && events_.top().time <= o_.sim_seconds) {
    const Event e = events_.top();
    events_.pop();
    ideal_integral_ += ideal * (e.time - last);
    window_ideal_ += ideal * (e.time - last);
    last = e.time;
    switch (e.kind) {
      case Kind::kArrive: on_arrive(e); break;
      case Kind::kDone: on_done(e); break;
      case Kind::kRetry: on_retry(e); break;
      case Kind::kRecover: on_recover(e); break;
      case Kind::kLost: start_micro_batch(e.time); break;
      case Kind::kKill: on_kill(e.time); break;
      case Kind::kForget:
        source_->remove(e.replica);
        for (Peer& p : peers_) {
          if (p.router) p.router->remove(e.replica);
        }
        break;
      case Kind::kRestart: {
        Peer& p = peers_[e.peer];
        if (p.state != State::kDown || p.incarnation != e.other) break;
        if (o_.rebalance_seconds > 0) {
          std::vector<StagePeer> view;
          for (int64_t i = 0; i < static_cast<int64_t>(peers_.size()); ++i) {
            const Peer& q = peers_[i];
            if (q.state == State::kServing || q.state == State::kLoading) {
              view.push_back({static_cast<uint64_t>(i), q.stage,
                              q.state == State::kServing ? estimate(q) : 0.0});
            }
          }
          p.stage = stage_for_joiner(view, costs_);
        } else {
          p.stage = p.home_stage;
        }
        p.state = State::kLoading;
        schedule({.time = e.time + o_.join_seconds, .kind = Kind::kJoined, .peer = e.peer,
                  .other = p.incarnation});
        break;
      }
      case Kind::kJoined:
        if (peers_[e.peer].state == State::kLoading && peers_[e.peer].incarnation == e.other) {
          join(e.peer);
        }
        break;
      case Kind::kRebalance: on_rebalance(e.time); break;
      case Kind::kWindow:
        s_.windows.push_back({e.time, static_cast<double>(window_samples_) / (e.time - window_start),
                              window_ideal_ / (e.time - window_start)});
        window_samples_ = 0;
        window_ideal_ = 0;
        window_start = e.time;
        schedule({.time = e.time + o_.window_seconds, .kind = Kind::kWindow});
        break;
    }
    ideal = ideal_now();
  }
  ideal_integral_ += ideal * (o_.sim_seconds - last);
  s_.samples_per_second =
      static_cast<double>(s_.micro_batches * o_.micro_batch) / o_.sim_seconds;
  s_.ideal = ideal_integral_ / o_.sim_seconds;
  s_.efficiency = s_.ideal > 0 ? s_.samples_per_second / s_.ideal : 0;
  s_.stage_peers.assign(costs_.size(), 0);
  for (const Peer& p : peers_) {
    if (p.state == State::kServing) ++s_.stage_peers[p.stage];
  }
  return s_;
}

void check(const SwarmSimOptions& o) {
  if (o.speeds.empty()) fail("swarm sim: speeds names no stage; give each stage's peer speeds");
  for (size_t s = 0; s < o.speeds.size(); ++s) {
    if (o.speeds[s].empty()) fail("swarm sim: stage {} has no peer; every stage needs one", s);
    for (double v : o.speeds[s]) {
      if (!(v > 0) || !std::isfinite(v)) fail("swarm sim: a speed of stage {} is {}, allowed > 0", s, v);
    }
  }
  if (!o.costs.empty() && o.costs.size() != o.speeds.size()) {
    fail("swarm sim: {} costs for {} stages; give one per stage or none", o.costs.size(),
         o.speeds.size());
  }
  for (double c : o.costs) {
    if (!(c > 0) || !std::isfinite(c)) fail("swarm sim: a stage cost is {}, allowed > 0", c);
  }
  const std::pair<const char*, double> times[] = {
      {"rebalance_seconds", o.rebalance_seconds}, {"kill_every", o.kill_every},
      {"restart_seconds", o.restart_seconds},     {"join_seconds", o.join_seconds},
      {"timeout_seconds", o.timeout_seconds},     {"link_seconds", o.link_seconds},
      {"min_gain", o.min_gain}};
  for (const auto& [name, v] : times) {
    if (!(v >= 0) || !std::isfinite(v)) fail("swarm sim: {} is {}, allowed >= 0", name, v);
  }
  if (!(o.jitter >= 0 && o.jitter < 1)) fail("swarm sim: jitter is {}, allowed [0, 1)", o.jitter);
  if (o.micro_batch <= 0) fail("swarm sim: micro_batch is {}, allowed >= 1", o.micro_batch);
  if (o.in_flight < 0) fail("swarm sim: in_flight is {}, allowed >= 0 (0: 4 per peer)", o.in_flight);
  if (!(o.sim_seconds > 0) || !(o.window_seconds > 0)) {
    fail("swarm sim: sim_seconds {} and window_seconds {} must be > 0", o.sim_seconds,
         o.window_seconds);
  }
}

}  // namespace

SwarmSimSummary run_swarm_sim(const SwarmSimOptions& options) {
  check(options);
  return Simulation(options).run();
}

}  // namespace agora
