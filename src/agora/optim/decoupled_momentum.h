// DeMo (Decoupled Momentum, arXiv 2411.19870), agora's default strategy: each peer sends the
// top-k DCT coefficients of its momentum per chunk instead of a gradient (docs/algorithms.md
// section 1 is the specification; the numbered steps below are those of its section 1.2).
//
// contribute(), per parameter p with local gradient g (already clipped by the caller):
//   2. delta <- beta * delta + lr * g
//   3. X = chunked_dct(delta); per chunk the top-k |X|: positions (ascending) and signed values
//   4. delta <- delta - chunked_idct(scatter(own selection)), with the unquantized values
//   and returns the payload (one-bit values when one_bit is set).
// apply(), with the contributions accepted for the step, its own included:
//   1. p <- p * (1 - lr * wd)                        (parameters marked decay only)
//   5-6. per coefficient, the mean of the values of the payloads that selected it (0 where none
//        did), summed in float32 in the canonical order (peer id, then bytes)
//   7. p <- p - lr * sign(chunked_idct(aggregate)), sign(0) = 0
//
// Inverse transforms of sparse coefficients (the own selection; the aggregate of few peers) run
// as sums of outer products when that is cheaper (dct.h sparse_chunked_idct): the same
// mathematics, different float rounding, chosen by the geometry and peer count alone so every
// peer takes the same path.
//
// Determinism: apply() depends only on the set of contributions, never on their order, so every
// peer applying the same set ends with the same bits.
//
// Hostile contributions (docs/security.md). apply() trusts nothing about a contribution but its
// bytes, and decides from them alone, so every honest peer decides the same:
//   - one that does not decode against payload_layout(), is for another step, or repeats the
//     bytes of another peer's contribution is left out, with the reason in the ApplyReport;
//   - the values of the rest are bounded per tensor to max_norm_ratio times the lower median
//     of the step's norms (influence.h), so none moves the model more than an honest one can;
//   - if the aggregate is still not finite anywhere, the step changes nothing (report.skipped).
//
// Psyche's look-ahead variant (options.lookahead): before_forward() moves every parameter by
// -lr_prev * sign(delta) so the gradient is taken at the look-ahead point; contribute() undoes the
// move first, and subtracts the own selection one step late (delta's recurrence is unchanged).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agora/optim/chunking.h"
#include "agora/optim/decoded_payloads.h"
#include "agora/optim/payload.h"
#include "agora/optim/strategy.h"

namespace agora {

struct DemoOptions {
  double beta = 0.999;
  int64_t topk = 32;
  int64_t chunk = 64;
  double weight_decay = 0.0;
  bool one_bit = false;
  bool lookahead = false;
  // Bounded influence (influence.h): a contribution's values, per tensor, are scaled down to at
  // most this many times the step's lower-median norm. 0 turns the bound off.
  double max_norm_ratio = 1.0;
};

class DecoupledMomentum final : public Strategy {
 public:
  DecoupledMomentum(std::vector<NamedParameter> params, const DemoOptions& options);

  std::string name() const override { return "demo"; }
  void before_forward(const StepContext& context) override;
  Contribution contribute(const StepContext& context) override;
  ApplyReport apply(const StepContext& context,
                    std::span<const Contribution> contributions) override;
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state) override;

  // What every contribution must look like: one dct_topk entry per parameter, in order.
  const PayloadLayout& payload_layout() const { return layout_; }
  // Where a caller that decodes contributions before apply() (a network peer's witness check)
  // decodes them, so that apply() takes them from there (by Contribution::hash) instead of
  // decoding them again (decoded_payloads.h). Shared: the check runs on the network's threads.
  const std::shared_ptr<DecodedPayloads>& decoded_payloads() const { return decoded_; }
  // Takes from `store` from now on: the peer's store, which outlives this strategy. Error when
  // its layout is not this strategy's.
  void share_decoded_payloads(std::shared_ptr<DecodedPayloads> store);
  // One line per parameter whose shape wastes compression (chunking.h compression_warning).
  std::vector<std::string> warnings() const override;

 private:
  struct Slot {
    NamedParameter param;
    ChunkGeometry geometry;
    torch::Tensor delta;    // the momentum, float32, the parameter's shape
    torch::Tensor pending;  // look-ahead only: the own selection, subtracted next step
    torch::Tensor moved;    // look-ahead only: the move before_forward() made, undone later
  };

  void undo_lookahead();
  // The contributions that may take part in the step, decoded; the rest go to report.refused.
  std::vector<Payload> admit(const StepContext& context,
                             std::span<const Contribution> contributions,
                             ApplyReport& report) const;
  // Step 6 and the inverse transform for parameter i: the direction before its sign.
  torch::Tensor aggregate_direction(size_t i, const std::vector<Payload>& payloads) const;

  DemoOptions options_;
  std::vector<Slot> slots_;
  PayloadLayout layout_;
  std::shared_ptr<DecodedPayloads> decoded_;
  double last_lr_ = 0.0;  // look-ahead: the previous step's learning rate
};

}  // namespace agora
