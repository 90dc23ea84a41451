// The connections of one pipeline stage process to its two neighbours (peer/stage_process.h),
// over the CURVE transport: stage i > 0 serves on `listen` (the previous stage connects), stage
// i < S - 1 connects to the next stage. Every message is an Envelope holding a StageData.
//
// Start: before any activation moves, the stages agree on the run and on where it resumes.
//   forward   stage 0 sends a hello with the run's fingerprint and the checkpoint steps it holds;
//             stage i checks the fingerprint against its own, keeps the steps it holds too, and
//             passes the hello on.
//   backward  the last stage picks the newest step left (0, the seeded start, is always held)
//             and sends it back as the start; each stage checks it is a step it offered and
//             passes it on.
// A stage that sends anything else first, a second hello, another fingerprint, more than
// kMaxHelloSteps steps or a start it was not offered is a protocol error blamed on that stage.
//
// Then the schedule's messages: boundary messages (pipeline/boundary_codec.h), which await()
// hands out in the order the schedule asks for, whatever order they arrive in. At most
// `max_waiting` may wait for their turn; more is a protocol error (a neighbour racing ahead
// without bound would otherwise grow this stage's memory).
//
// Admission: anyone who knows a stage's endpoint and key can complete the CURVE handshake with
// it, so a stage > 0 listens to one previous stage only: the key `prev_key` names, or else the
// first key that speaks to it (trust on first use: enough on a private network, not against an
// outsider racing the real previous stage, which --prev-key stops). Messages from any other key
// are dropped unread (ignored() counts them): they cannot stop the stage, fill its queue or take
// over the route its gradients go back on. Once the previous stage's key is known (at once with
// `prev_key`), the CURVE handshake admits that key only (refused_handshakes() counts the others),
// so an outsider cannot even make the stage receive a frame. The next stage is the one whose key
// the CURVE handshake proved.
//
// Failure: a neighbour silent for `timeout_seconds` while this stage waits on it
// (`start_timeout_seconds` during the start), a message that
// does not decode or does not belong, or a neighbour's report that it stopped throws an Error
// naming this stage and what happened, and blamed() says which stage is at fault (-1: none of
// the neighbours). tell_failure() then tells both neighbours, which stop at once naming the
// stage that failed first rather than waiting out their timeouts.
//
// Torch-free: it moves bytes; the stage's model and codec coder live in stage_process.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/pipeline/boundary_codec.h"

namespace agora::peer {

// The most checkpoint steps a hello may offer (a stage keeps far fewer).
inline constexpr size_t kMaxHelloSteps = 64;
// A run's fingerprint: BLAKE2b-256 (pipeline/stage_checkpoint.h, stage_run_fingerprint).
inline constexpr size_t kFingerprintBytes = 32;

struct StageLinkOptions {
  int64_t stage = 0, stages = 2;
  std::string listen;                      // stage > 0
  std::string next;                        // stage < stages - 1
  net::PublicKey next_key;                 // ... and the next stage's ed25519 key
  std::optional<net::PublicKey> prev_key;  // stage > 0: the only previous stage it listens to
  double timeout_seconds = 60;
  // How long start() waits for a neighbour's hello or start: stages on separate machines are
  // started by hand, minutes apart.
  double start_timeout_seconds = 600;
  int64_t max_waiting = 64;  // boundary messages that may wait for their turn
  // The largest boundary message a neighbour may send, in bytes; 0: net::DecodeLimits' default.
  size_t max_boundary_bytes = 0;
};

class StageLink {
 public:
  StageLink(const net::Identity& identity, const StageLinkOptions& options);

  // Where this stage serves ("" for stage 0).
  std::string endpoint() const;

  // The start handshake: `fingerprint` identifies the run (every stage must have the same),
  // `steps` the checkpoint steps this stage holds. Returns the step every stage starts at: the
  // newest held by all, or 0.
  uint64_t start(const std::string& fingerprint, std::vector<uint64_t> steps);

  void send_forward(std::string bytes);
  void send_backward(std::string bytes);

  // Waits for the boundary message (direction, step, piece) from the neighbour it comes from.
  std::string await(BoundaryDirection direction, int64_t step, int64_t piece);

  // Best effort: the neighbours learn why this stage stops.
  void tell_failure(const std::string& what);
  // Once the run is over: a moment for ZeroMQ to write what was sent (the neighbour may read).
  void drain();

  int64_t blamed() const { return blamed_; }
  // Messages dropped because another key than the previous stage's sent them.
  uint64_t ignored() const { return ignored_; }
  // Handshakes the admission refused (keys other than the previous stage's, once it is known).
  uint64_t refused_handshakes() const { return context_.refused(); }
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  using Clock = std::chrono::steady_clock;

  void pump(std::chrono::milliseconds wait);
  void admit_only_previous();
  void take(const wire::Envelope& message, BoundaryDirection expected);
  void take_hello(const wire::StageHello& hello, BoundaryDirection expected);
  // Pumps until `ready` or the neighbour in `direction` has been silent for the timeout.
  template <typename Ready>
  void wait_for(BoundaryDirection direction, const char* what, double timeout, Ready ready);

  int64_t stage_, stages_;
  double timeout_, start_timeout_;
  int64_t max_waiting_;
  net::Context context_;
  std::optional<net::Server> server_;
  std::optional<net::Client> client_;
  std::string prev_route_;
  std::string prev_curve_;  // the previous stage's curve25519 key, once known
  uint64_t ignored_ = 0;
  int64_t blamed_ = -1;
  Clock::time_point last_heard_prev_, last_heard_next_;
  std::optional<wire::StageHello> hello_, start_;  // from the previous / next stage
  std::map<std::tuple<int, int64_t, int64_t>, std::string> waiting_;
};

}  // namespace agora::peer
