#include "agora/train/recompute.h"

#include <fmt/format.h>

#include <cmath>

#include "agora/core/error.h"

namespace agora {

Recomputed recompute(const TrainStep& step, Learner& scratch, const CommittedStep& committed,
                     const std::atomic<bool>* stop) {
  if (committed.params.size() != scratch.params.size()) {
    throw Error(fmt::format("the committed step has {} parameter tensors but the model has {}",
                            committed.params.size(), scratch.params.size()));
  }
  if (committed.strategy_state == nullptr) {
    throw Error("the committed step has no strategy state to recompute from");
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < committed.params.size(); ++i) {
      const torch::Tensor& from = committed.params[i];
      torch::Tensor& to = scratch.params[i];
      if (!from.sizes().equals(to.sizes())) {
        throw Error(fmt::format("committed parameter {} has shape {} but the model's has {}", i,
                                c10::str(from.sizes()), c10::str(to.sizes())));
      }
      to.copy_(from);
    }
  }
  scratch.strategy->load_state(*committed.strategy_state);
  Recomputed out;
  out.result = step.run(scratch, committed.context, committed.ranges, stop);
  if (!out.result.completed) throw Cancelled("the recomputation was stopped");
  for (const auto& [name, tensor] : scratch.strategy->state())
    out.state_after[name] = tensor.clone();
  return out;
}

double relative_state_error(const std::map<std::string, torch::Tensor>& a,
                            const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) {
    throw Error(
        fmt::format("cannot compare strategy states of {} and {} tensors", a.size(), b.size()));
  }
  double diff2 = 0, norm2 = 0;
  for (const auto& [name, x] : a) {
    const auto y = b.find(name);
    if (y == b.end()) throw Error(fmt::format("strategy state {} is missing on one side", name));
    if (!x.sizes().equals(y->second.sizes())) {
      throw Error(fmt::format("strategy state {} has shapes {} and {}", name, c10::str(x.sizes()),
                              c10::str(y->second.sizes())));
    }
    const torch::Tensor xd = x.to(torch::kFloat64), yd = y->second.to(torch::kFloat64);
    diff2 += (xd - yd).pow(2).sum().item<double>();
    norm2 += yd.pow(2).sum().item<double>();
  }
  if (norm2 > 0) return std::sqrt(diff2 / norm2);
  return diff2 > 0 ? INFINITY : 0.0;
}

}  // namespace agora
