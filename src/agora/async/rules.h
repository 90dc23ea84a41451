// The decisions of an asynchronous data-parallel run that need no tensors (docs/async.md):
// what a worker signs when it delivers a pseudo-gradient, how the server judges the size of
// one, and how many inner steps a worker of measured speed gets under DyLU. Pure functions of
// their inputs, so they are unit-tested without sockets or clocks.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

// The bytes a worker's ed25519 signature covers: a domain tag, the run id (u16 length first),
// the work id, and the BLAKE2b-256 of the payload. Binding the run and the work id means a
// delivery cannot be replayed into another run or for other work. Error for a run id longer
// than 65535 bytes.
std::string delivery_signing_bytes(std::string_view run_id, uint64_t work_id,
                                   std::string_view payload);

// The verdicts a delivery receives, as receipts and logs name them. Every one but kAccepted
// and kStale strikes the worker: an honest worker never sends them.
inline constexpr std::string_view kAccepted = "accepted";
inline constexpr std::string_view kStale = "stale";            // from parameters too old
inline constexpr std::string_view kUnassigned = "unassigned";  // not the work it holds (replay)
inline constexpr std::string_view kBadSignature = "bad_signature";
inline constexpr std::string_view kMalformed = "malformed";  // does not decode to the layout
inline constexpr std::string_view kOutlier = "outlier";      // not finite, too large or too small
inline constexpr std::string_view kTooSoon = "too_soon";     // back faster than anyone computes
bool strikes(std::string_view verdict);

// Judges the size of each pseudo-gradient D before it moves the run's parameters theta. From the
// bytes alone:
//   - D must not be all zeros, nor (once the median M below holds) smaller per inner step than
//     M / max_ratio: each delivery is an outer step, which under a momentum method applies the
//     momentum again, so a flood of negligible deliveries would move theta as much as honest
//     work (bench_poisoning_network, `tiny`: one worker of eight delivering 1e-6 everywhere at
//     once made over 1500 extra outer steps of look-ahead in 90 s, +32% in final loss);
//     counted, they would also drag M down;
//   - ||D|| <= max_relative * ||theta||: no delivery may move theta by more than theta's own
//     size (a hostile worker's first delivery meets this bound already);
//   - ||D|| / steps <= max_ratio * M once `min_workers` workers have accepted deliveries, where M
//     is the median over WORKERS of each worker's median of its last `per_worker` accepted
//     ||D|| / steps. Per inner step, because DyLU gives workers different step counts and D
//     grows with them. Per worker, so that a worker counts once however often it delivers: a
//     hostile worker that delivers tiny updates ten times as often as the others moves M no more
//     than one honest worker would (before, M was the median of the last 16 deliveries, which a
//     fast liar filled alone). M is lost to a majority of workers only.
// Honest D's norms vary by a few times across workers and rounds; the default ratio of 10
// leaves room for that and refuses a D scaled up by a hostile worker. (agora's rule; DiLoCo and
// its asynchronous variants trust their workers and have none.)
struct NormGuardOptions {
  double max_relative = 1.0;
  double max_ratio = 10;
  size_t per_worker = 4;     // the newest accepted deliveries kept of each worker
  size_t min_workers = 2;    // workers with accepted deliveries before the median bound holds
  size_t max_workers = 256;  // workers remembered; the longest without a delivery goes first
};

class NormGuard {
 public:
  explicit NormGuard(NormGuardOptions options = {}) : options_(options) {}
  // Why a D of this norm is refused (plain words with the figures), or nullopt to accept.
  // A norm that is not finite, or zero, is always refused.
  std::optional<std::string> check(double norm, double theta_norm, int64_t steps) const;
  // Records a delivery of `worker` that was accepted.
  void accept(const std::string& worker, double norm, int64_t steps);
  // M: the median over workers of their medians of ||D|| / steps (0 with none).
  double median() const;
  size_t workers() const { return by_worker_.size(); }
  // What a restart puts back: each worker's kept ||D|| / steps, oldest first.
  std::map<std::string, std::vector<double>> recent() const;
  void restore(const std::map<std::string, std::vector<double>>& recent);

 private:
  struct Kept {
    std::deque<double> per_step;  // oldest first
    uint64_t last = 0;            // when it last delivered, in accepted deliveries
  };
  NormGuardOptions options_;
  std::map<std::string, Kept> by_worker_;
  uint64_t accepted_ = 0;
};

// A bias-corrected moving average of a worker's seconds per inner step (alpha 0.3): the first
// measurement counts fully, later ones move it by a share.
class PaceEstimate {
 public:
  void add(double seconds_per_step);
  bool known() const { return n_ > 0; }
  double seconds_per_step() const;

 private:
  double average_ = 0, weight_ = 0;
  int64_t n_ = 0;
};

// Why a delivery came back too soon, or nullopt: `seconds_per_step` (from its hand-out to its
// arrival, over its inner steps) faster than `max_speedup` times the median of `others` (the
// other workers' measured paces; none is judged with fewer than two). Nobody computes an inner
// step ten times faster than the median worker in a run (DyLU's reference follows the same
// bound), so such a delivery trained nothing: it only buys outer steps. (agora's rule.)
std::optional<std::string> too_soon(double seconds_per_step, std::vector<double> others,
                                    double max_speedup = 10);

// DyLU's inner steps for a worker: H_w = max(1, floor(v_w / v_ref * H)), v = 1 / seconds per
// step, v_ref the fastest worker's. Error for a time that is not positive or H < 1.
int64_t dylu_inner_steps(double seconds_per_step, double fastest_seconds_per_step, int64_t H);

// v_ref for DyLU, from the workers' measured seconds per step: the fastest of the workers at most
// `max_speedup` times faster than the median worker (0 for no workers). The server measures a
// pace from hand-out to delivery, which a worker controls: one that delivers right after each
// hand-out, training nothing, would be "fastest" by any factor and give every honest worker
// H_w = 1. (agora's guard; DyLU as published takes the fastest as it is.)
double dylu_reference_seconds(std::vector<double> seconds_per_step, double max_speedup = 10);

}  // namespace agora
