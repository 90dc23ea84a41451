// Strategy: how a step's gradients become a parameter update, possibly across peers.
//
// The local trainer and a network peer run the same step (train/step.h) whatever runs behind this
// interface:
//
//   strategy.before_forward(step)                   // Psyche's look-ahead moves the weights here
//   forward/backward (gradients accumulate in each parameter's .grad()), local clipping
//   own = strategy.contribute(step)                 // this peer's share, as payload bytes
//   ... exchange: every peer gathers the contributions accepted for the step ...
//   strategy.apply(step, contributions)             // every peer applies the same set
//
// contribute() reads the gradients and returns a payload (optim/payload.h), or empty bytes when
// the strategy has nothing to exchange this step (AdamW alone, or DiLoCo between syncs); it may
// also move the parameters (DiLoCo's inner step). The strategy does not know its own peer id: the
// caller fills Contribution::peer. apply()
// receives the contributions of every peer accepted for the step, its own included, and must
// leave every honest peer with bit-identical parameters: it orders them canonically itself (by
// peer id, then bytes), so the result does not depend on the order they arrived in; the caller
// passes at most one contribution per peer (a duplicate would count twice). What apply() does
// with a contribution that is malformed or extreme is the strategy's to say (DeMo leaves it out
// and bounds every contribution's influence; see its header) but it is always decided from the
// bytes alone, so every honest peer decides the same; the ApplyReport tells the caller what was
// decided.
//
// A strategy also owns the state a resumed run needs (moments, momentum buffers) and exposes it
// as named tensors for checkpoints.
#pragma once

#include <torch/torch.h>

#include <map>
#include <span>
#include <string>
#include <vector>

namespace agora {

// A parameter as strategies see it: its model name keys its state; `decay` says whether decoupled
// weight decay applies (matrices yes, norms no, by the trainer's rule).
struct NamedParameter {
  std::string name;
  torch::Tensor tensor;
  bool decay = true;
};

// One peer's contribution to one step.
struct Contribution {
  std::string peer;   // the sender's id; the canonical order sorts by it
  std::string bytes;  // an encoded Payload, or empty
  // BLAKE2b-256 of `bytes` when the caller already checked it (a network peer checks every
  // payload against its commitment): how DeMo finds the payload decoded at fetch. Empty: unknown.
  std::string hash = {};
};

// What apply() decided beyond "apply everything as sent".
struct ApplyReport {
  struct Refusal {
    std::string peer;
    std::string reason;  // names the field and what was allowed
  };
  std::vector<Refusal> refused;  // contributions left out of the step
  int64_t clipped = 0;           // (contribution, tensor) entries scaled down to the bound
  // The update was not finite (a non-finite aggregate): the step changed nothing.
  bool skipped = false;
  int64_t predecoded = 0;  // payloads taken decoded from where the caller decoded them at fetch
};

struct StepContext {
  int64_t step = 0;       // 0-based optimizer step
  double lr = 0.0;        // the schedule's learning rate for this step
  int64_t num_peers = 1;  // peers training this step (1 for a local run)
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // Called before the step's forward pass; the default does nothing.
  virtual void before_forward(const StepContext& context) { (void)context; }
  // Reads the accumulated gradients; returns what this peer sends for the step.
  virtual Contribution contribute(const StepContext& context) = 0;
  // Updates the parameters from the contributions of the step's peers (any order).
  virtual ApplyReport apply(const StepContext& context,
                            std::span<const Contribution> contributions) = 0;

  // Things the user should know before training, e.g. tensors DeMo compresses poorly.
  virtual std::vector<std::string> warnings() const { return {}; }

  // Everything a resumed run needs, by stable names; load_state() takes what state() gave. The
  // tensors are the live ones, not copies: clone to keep them across a step.
  virtual std::map<std::string, torch::Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;
};

// The canonical order of a step's contributions: by peer id, then by bytes. Returns pointers
// into `contributions`; empty contributions are left out.
std::vector<const Contribution*> canonical_order(std::span<const Contribution> contributions);

}  // namespace agora
