// A peer's part in verification by recomputation (docs/verification.md), both roles:
//
//   As an author. Each commit carries the hashes of the peer's strategy state (DeMo's momentum)
//   before and after the step, signed; both states are kept (by hash) for the verifiers the
//   coordinator names, for the last verify.window rounds. A peer also keeps the parameters each
//   of those rounds trained from: when it is asked to verify, it holds what the author held.
//
//   As a verifier. A SpotCheck goes to a queue; one worker thread per peer takes it, fetches
//   the manifests of the author's two states (each hashes to the author's commitment) and the
//   tensors of the check's sample of them (peer/state_sample.h), each checked against its
//   manifest. The training thread, when it next waits for the coordinator, recomputes the
//   author's step on a scratch model of its own (train/recompute.h) from the parameters kept
//   for that round, compares the result with the author's payload and state on the sample
//   (optim/payload_agreement.h) and sends a Verdict. Outcomes:
//     AGREES     payload and state within AgreementTolerance;
//     DISAGREES  outside it, or the author did not serve a state it committed to in time, or
//                served one that does not hash to the commitment;
//     ABSTAINS   this peer cannot check it: no parameters kept for that round, payload not held,
//                the author is relayed (nobody can dial it), or the queue is full.
//   Neither thread holds mutex_ while it fetches or computes.
//
// Test hooks (AGORA_TEST_CHEAT, AGORA_TEST_FALSE_VERDICTS): peer/test_hooks.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agora/data/sequence_range.h"
#include "agora/peer/peer_context.h"

namespace agora::peer {

class Verification {
 public:
  explicit Verification(PeerContext& peer) : peer_(peer) {}
  ~Verification();
  Verification(const Verification&) = delete;
  Verification& operator=(const Verification&) = delete;

  // True when the run checks contributions (verify.rate > 0, DeMo).
  bool enabled() const;

  // Once the session is built, on the training thread: makes the model and strategy checks are
  // recomputed on (a second copy of the run's, so it costs the memory of one more learner).
  // Learner::create seeds torch's global generator, which only this thread may use, and making
  // it here keeps the seconds it takes out of the rounds.
  void prepare();

  // Author, on the training thread. Before the step: keeps the parameters the round trains
  // from, and the strategy state before it. After: commits to both states in `commit`, and to
  // the steps applied to the parameters it trained from.
  // after_step() returns the seconds both spent (copies and hashes of the parameters and the
  // momentum), for the round's log.
  void before_step();
  double after_step(wire::Commit& commit);

  // Verifier, on the training thread whenever it waits for the coordinator: recomputes the
  // checks whose inputs have arrived, in the time the coordinator's split cut from this peer's
  // share for them (coord/assignment.h weights_after_checks). Not on a thread beside training:
  // there a check slowed training by more than its own work, and itself took 8 times as long
  // (docs/results.md). gathering(): a check's inputs are being fetched (worth waiting for).
  void run_ready_checks();
  bool gathering() const;

  // Verifier, on the training thread: queues a check with the parameters it needs, or holds it
  // until this peer applied as many steps as the author (answered ABSTAINS at once when they
  // are gone or the queue is full). A second or third opinion goes first: a dispute holds a
  // check open, and its states are kept only so long. A check not started within verify.seconds
  // is dropped unanswered: the coordinator has asked another verifier.
  void submit(const wire::SpotCheck& check);
  // After a step was applied (and before training): keeps a copy of the parameters for the
  // checks of rounds trained from them, for verify.window counts.
  void keep_parameters();
  // After a sync: the parameters kept may not be the run's at their counts (this peer was in a
  // minority, or the run went back to a checkpoint); they are dropped.
  void forget_parameters();

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  void make_scratch();
  void cancel_stale_check();
  std::shared_ptr<const StrategyState> snapshot_strategy() const;
  // Which tensors hold the strategy state and how often each was written (torch's version
  // counter): equal identities mean an unchanged state.
  std::vector<std::pair<const void*, int64_t>> identity_of_state() const;
  void work();
  struct Queued {
    wire::SpotCheck check;
    std::vector<torch::Tensor> params;  // the copy kept for its count; never written
    std::chrono::steady_clock::time_point received;
    uint64_t generation = 0;  // generation_ when its parameters were pinned
  };
  // A check whose inputs arrived and match the author's commitments: ready to recompute.
  struct Gathered {
    Queued queued;
    std::string payload;
    // The author's momentum: `after` holds the sampled tensors, `before` every tensor (zeros
    // outside the sample: a recomputation needs them all, and they are not compared).
    std::map<std::string, torch::Tensor> before, after;
    std::vector<size_t> sampled;  // indices into momentum_names_
    uint64_t state_bytes = 0;     // fetched
    std::chrono::steady_clock::time_point ready_at;
  };
  void enqueue(Queued queued);  // mutex_ held
  bool stale(const Queued& queued) const;
  // False once a resync replaced the parameters `queued` pinned (forget_parameters).
  bool current(const Queued& queued) const;
  // Answers `verdict`, or ABSTAINS when the check is no longer current().
  void settle(const Queued& queued, wire::Verdict verdict, bool background);
  // How long a ready check waits for the training thread before it runs beside training.
  double idle_seconds() const;
  // Waits for the payload, fetches the author's states' manifests and the sample's tensors and
  // checks them against its commitments: a verdict when that already decides (or cannot), else
  // `out` is ready (verification_gather.cc).
  std::optional<wire::Verdict> gather(Queued queued, Gathered& out);
  // Recomputes and compares; compute_mutex_ held. Throws Cancelled when `stop` is set; any other
  // failure (out of memory, a device error) is ABSTAINS.
  wire::Verdict judge(const Gathered& gathered, const std::atomic<bool>* stop);
  wire::Verdict recompute_and_compare(const Gathered& gathered, const std::atomic<bool>* stop);
  // What a check of the whole states would fetch: both states and their manifests.
  uint64_t whole_state_bytes() const;
  // `background`: the worker recomputed it, beside training, not the training thread.
  void answer(const wire::SpotCheck& check, wire::Verdict verdict, bool background = false);

  PeerContext& peer_;
  std::shared_ptr<const StrategyState> before_;  // of the step being trained
  // Of the last step trained, while its identity holds.
  std::shared_ptr<const StrategyState> after_;
  std::vector<std::pair<const void*, int64_t>> after_identity_;
  double bookkeeping_seconds_ = 0;
  uint64_t trained_from_ = 0;
  // The round being trained: the coordinator ends a check verify.window rounds on, and its
  // states may be gone; the worker skips such checks.
  std::atomic<uint64_t> latest_round_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;     // to gather
  std::deque<Gathered> ready_;   // to recompute
  std::vector<Queued> waiting_;  // for parameters after more steps than applied yet
  // applied steps -> the parameters rounds trained from after that many steps
  std::map<uint64_t, std::vector<torch::Tensor>> parameters_;
  std::atomic<bool> stopping_ = false;  // also cancels a fetch in flight
  // The recomputation in flight (the worker's), and the flag that stops it: set at shutdown or
  // by the training thread once its check is stale (cancel_stale_check, from before_step).
  std::atomic<bool> cancel_ = false;
  std::atomic<bool> running_ = false;
  uint64_t running_step_ = 0;                               // mutex_
  std::chrono::steady_clock::time_point running_received_;  // mutex_
  std::thread worker_;
  // Held by whichever thread recomputes: scratch_ and step_ are one.
  std::mutex compute_mutex_;
  bool gathering_ = false;   // mutex_; the worker fetches a check's inputs
  uint64_t generation_ = 0;  // mutex_; bumped by each resync (forget_parameters)
  // Step start to step start, on the training thread (before_step).
  std::atomic<double> round_seconds_ = 1.0;
  std::optional<std::chrono::steady_clock::time_point> last_step_started_;
  // Made by prepare() (before the worker starts); used under compute_mutex_.
  std::unique_ptr<Learner> scratch_;
  std::unique_ptr<TrainStep> step_;
  // The scratch's momentum tensors' names and shapes, set with it; and the names in the order
  // of the payload's tensors (the model's parameters).
  std::map<std::string, torch::Tensor> momentum_like_;
  std::vector<std::string> momentum_names_;
};

}  // namespace agora::peer
