// AsyncOuter: the run's parameters moved by one pseudo-gradient at a time, as each arrives
// (docs/algorithms.md section 8, "Asynchronous data parallelism"). The fourth strategy family
// beside DeMo, all-reduce and DiLoCo: workers run their inner steps at their own pace from the
// parameters they last pulled and send D = theta_pulled - theta_local when they finish; nobody
// waits for the slowest.
//
// Per arrival of D (fp32, the parameters' shapes), with lr eta and momentum g:
//   kNesterov (asynchronous DiLoCo, DiLoCo's outer step applied per arrival):
//     buf <- g buf + D;                theta <- theta - eta (D + g buf)
//   kLookahead (momentum look-ahead delay correction, Pluralis; the form the issue states, since
//     the exact published update could not be confirmed):
//     m <- g m + (1 - g) D;            theta <- theta - eta (g m + D)
//   kLookaheadDiscounted (the variant with the stale D discounted by (1 - g)):
//     m <- g m + (1 - g) D;            theta <- theta - eta (g m + (1 - g) D)
// Synchronous DiLoCo is kNesterov applied once per round to the mean of the round's D.
//
// One operation at a time, in a fixed order, so that the same arrivals in the same order give the
// same bits on every machine. Torch; tensors stay on the device of the initial parameters.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace agora {

enum class OuterRule { kNesterov, kLookahead, kLookaheadDiscounted };

// "nesterov", "lookahead", "lookahead_discounted"; parse throws Error naming what is allowed.
std::string to_string(OuterRule rule);
OuterRule parse_outer_rule(const std::string& text);

struct AsyncOuterOptions {
  OuterRule rule = OuterRule::kNesterov;
  double lr = 0.7;        // eta
  double momentum = 0.9;  // g (mu for Nesterov), in [0, 1)
};

class AsyncOuter {
 public:
  // `initial`: the run's starting parameters, copied (fp32).
  AsyncOuter(const std::vector<torch::Tensor>& initial, const AsyncOuterOptions& options);

  // Moves theta by one pseudo-gradient (same shapes as theta; any dtype, read as fp32). Throws
  // Error when the count or a shape differs, or a value is not finite (nothing changes then).
  void apply(const std::vector<torch::Tensor>& pseudo_gradient);

  // Puts back a state saved from theta(), momentum() and updates() (a server's restart). Throws
  // Error when the tensors' count or shapes are not theta's.
  void restore(const std::vector<torch::Tensor>& theta, const std::vector<torch::Tensor>& momentum,
               int64_t updates);

  const std::vector<torch::Tensor>& theta() const { return theta_; }
  const std::vector<torch::Tensor>& momentum() const { return momentum_; }
  int64_t updates() const { return updates_; }

 private:
  AsyncOuterOptions options_;
  std::vector<torch::Tensor> theta_, momentum_;
  int64_t updates_ = 0;
};

}  // namespace agora
