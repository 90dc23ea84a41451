// One replica of a pipeline stage in a swarm (`agora swarm peer`, docs/swarm.md section 4).
//
// The coordinator (coordinator_server.h) says which stage it serves; it holds that stage's
// layers (pipeline/stage_model.h) and serves on `listen`. Every few tens of milliseconds it
// polls the coordinator with its state and learns the step, the phase, the replicas of the next
// stage ready for the step, the members of the previous stage, and (stage 0) the micro-batches
// it is given. Per micro-batch of m sequences (every replica reads the tokens from its own copy
// of the data: the step and the micro-batch fix them):
//   stage 0     forward on the tokens, the activations to the replica of stage 1 that its
//               SwarmRouter (router.h) picks; keeps the output until the gradient comes back,
//               then the backward, and reports the micro-batch done with the loss.
//   middle      forward, on to a replica of the next stage by its own router; the backward when
//               the gradient returns, the input's gradient back on the connection the forward
//               came in on.
//   last        forward, loss (scaled by 1 / M), backward, the gradient straight back.
// Gradients accumulate in the stage's parameters over the step, whichever micro-batches this
// replica happened to carry. Each backward reports the answering replica's compute time, which
// its sender's router learns throughput from.
//
// At the end of the step (phase syncing) every ready replica sends the coordinator its DeMo
// contribution (optim/decoupled_momentum.h, over the stage's parameters, the config's [demo]
// and optimizer.weight_decay, the gradient clipped per replica to optimizer.grad_clip), and
// applies its stage's round, the same contributions in the same order on every replica: the
// replicas of a stage stay bit-identical (tested), each with its own residual momentum, exactly
// as whole-model DeMo peers are.
//
// Joining later, restarting, or moved by the coordinator to another stage: it fetches the
// stage's parameters at the step from the replica the coordinator names (GetTensor /
// TensorData), checks their hash against the stage's and starts with zero momentum. With
// `state_dir`, it saves its stage (parameters and momentum) after every step, so that when every
// replica of a stage has died, a restarted one brings the stage back at the step the run waits
// at (the coordinator checks the hash).
//
// Faults. A stage-0 replica sends a micro-batch again (kept encoded, no recompute) when the
// replica it went to has left the next stage, when it was out as the coordinator lost a member
// and has not returned within two round trips (at least a second: a replica on its path died,
// and what it held is gone), or after `timeout_seconds`. A replica that dies costs the
// micro-batches in flight through it; one sent again may add its gradient twice on the stages its
// first attempt reached past the death (a few per death; the replicas stay identical). Messages
// from keys that are not the previous stage's members are dropped unread, and its stage's
// parameters go only to the other members of its stage (the view's `peers`), each within its own
// budget; a frame larger than a hop is not received; what waits to be computed is bounded;
// anything kept for a step is dropped when the step is over. A sender counts an answer for its
// router only for an attempt it has out to that replica, with the reported time bounded by its
// own round trip (router.h's counted_seconds), and skips a replica that let a send time out.
// It names that replica to the coordinator (schedule.h, "Work dropped"), unless the replica
// answers `lost` first: a middle stage whose own send timed out gives the micro-batch up, tells
// its sender so, and names its next replica instead.
//
// `pace_unit` > 0 plays a slower machine: a micro-batch's forward takes at least
// pace_unit * cost / speed * m / 3 seconds and its backward twice that (cost: the stage's compute
// relative to the mean stage's, from the partition), by sleeping out the difference.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/net/identity.h"

namespace agora {

struct SwarmPeerOptions {
  std::string coordinator;  // tcp://HOST:PORT
  net::PublicKey coordinator_key;
  std::string listen;            // where replicas of the previous stage connect
  std::string advertise;         // the endpoint others dial ("" = listen's, 0.0.0.0 -> 127.0.0.1)
  int64_t stage = -1;            // asked for; -1 = the coordinator chooses
  double speed = 1;              // with pace_unit: this machine's speed (1 = reference)
  double pace_unit = 0;          // seconds per sample (forward + backward) at speed 1; 0 = none
  std::vector<double> costs;     // per stage, for the pace; empty = swarm_stage_costs
  int64_t in_flight = 4;         // stage 0: micro-batches in flight at once
  bool uniform_routing = false;  // uniform random routing (the baseline), not by throughput
  double poll_seconds = 0.02;
  double timeout_seconds = 30;      // coordinator silence; a micro-batch's round trip
  std::filesystem::path events;     // JSON lines
  std::filesystem::path out_dir;    // the stage file at the end (agora merge-stages)
  std::filesystem::path state_dir;  // the stage after every step, to bring it back
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
  // Tests only: play a hostile replica (tests/integration/swarm_attack_test.py). "hold" (stage
  // 0) asks for all the micro-batches it may hold and never works on them; "mute" never sends
  // its round contribution; "liar" answers every forward at once with garbage backwards that
  // claim 1e-30 s of compute, for its attempt and the next three, and drops the forward.
  // Poisoning (bench/poisoning/bench_poisoning_network.py): "sign_flip", "scale" (x 1e6) and
  // "zero" rewrite its round contribution's values; "garbage" sends every backward it answers
  // as the honest gradient negated and scaled by 100 (routed work nobody checks).
  std::string behave;
};

struct SwarmPeerSummary {
  int64_t stage = -1;
  uint64_t version = 0;        // the steps its stage's parameters have had
  std::string parameter_hash;  // hex, of its stage at `version`
  int64_t forwards = 0, backwards = 0, fetches = 0, moves = 0;
  double seconds = 0;
  bool finished = false;  // the run finished (not stopped)
};

// Runs until the run is finished, *stop, or an error (thrown, naming what happened).
SwarmPeerSummary run_swarm_peer(const RunConfig& config, const net::Identity& identity,
                                const SwarmPeerOptions& options);

}  // namespace agora
