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
//   kDelayedNesterov (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling",
//     arXiv 2401.09135, Algorithm "Delayed Nesterov"; the update of its reference code in
//     utnslab/halos), buffer N, momentum activation c in [0, 1/N]: the arrivals are summed in a
//     buffer B, the momentum moves once every N arrivals, plain steps go in between:
//     B <- B + D; at every N-th arrival:  m <- g m + B / N;  B <- 0;
//                                        theta <- theta - eta ((1 - cN + c) g m + D / N)
//     at the others:                      theta <- theta - eta (c g m + D / N)
//     With N = 1 and c = 0 it is kNesterov. The paper's answer to a full Nesterov step per stale
//     arrival, which lags synchronous DiLoCo in its experiments and diverges in agora's at lr 0.7.
//   kHeloco (HeLoCo, arXiv 2606.00271: direction-aware correction of stale pseudo-gradients; the
//     formulas and constants as its public re-implementation gives them, citing the paper's
//     equations; only the abstract could be read here), per tensor, against m before this arrival:
//     c = cos(D, m), conf = |D| / (|D| + kappa |m| + eps);
//     G = D                                   when |D| or |m| is ~0, or c >= c_ok;
//     G = D - b c |D| m / |m|                 when c < 0, with b = min(k_s (-c) conf, beta_max)
//                                             (a D that opposes the momentum is pulled toward it);
//     G = |D| u / |u|, u = (1 - l) D/|D| + l m/|m|, l = min(k_d (1 - c) conf, 1)   otherwise
//                                             (one that agrees too little is turned toward it);
//     then G <- rho G and the look-ahead step:  m <- g m + (1 - g) G;  theta <- theta - eta (g m +
//     G)
// Synchronous DiLoCo is kNesterov applied once per round to the mean of the round's D.
//
// One operation at a time, in a fixed order, so that the same arrivals in the same order give the
// same bits on every machine. Torch; tensors stay on the device of the initial parameters.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace agora {

enum class OuterRule { kNesterov, kLookahead, kLookaheadDiscounted, kDelayedNesterov, kHeloco };

// "nesterov", "lookahead", "lookahead_discounted", "delayed_nesterov", "heloco"; parse throws
// Error naming what is allowed.
std::string to_string(OuterRule rule);
OuterRule parse_outer_rule(const std::string& text);

// The rule each method of asynchronous data parallelism applies per arrival, as published:
// async and dylu (Liu et al.'s asynchronous DiLoCo and DyLU) kDelayedNesterov, lookahead and
// lookahead_discounted theirs; sync kNesterov (once per round). Error for another method.
OuterRule outer_rule_of_method(const std::string& method);

// kHeloco's constants (the defaults of its public re-implementation; whether they are the paper's
// tuned values could not be checked).
struct HelocoOptions {
  double c_ok = 0.2;      // a cosine with the momentum at or above it passes D unchanged
  double k_s = 0.5;       // how hard a D that opposes the momentum is pulled toward it
  double k_d = 1.0;       // how far a D that agrees too little is turned toward it
  double kappa = 3;       // the confidence in D: |D| / (|D| + kappa |m|)
  double beta_max = 0.5;  // the most of the pull
  double rho = 1;         // the corrected D's scale (the code notes 1/sqrt(workers) as an option)
};

struct AsyncOuterOptions {
  OuterRule rule = OuterRule::kNesterov;
  double lr = 0.7;        // eta
  double momentum = 0.9;  // g (mu for Nesterov), in [0, 1)
  // kDelayedNesterov only: N, arrivals per momentum update (the paper uses the number of
  // workers), and c, the momentum's share of the steps in between (the paper's default 0).
  int64_t buffer = 1;
  double activation = 0;
  HelocoOptions heloco = {};
};

class AsyncOuter {
 public:
  // `initial`: the run's starting parameters, copied (fp32).
  AsyncOuter(const std::vector<torch::Tensor>& initial, const AsyncOuterOptions& options);

  // Moves theta by one pseudo-gradient (same shapes as theta; any dtype, read as fp32). Throws
  // Error when the count or a shape differs, or a value is not finite (nothing changes then).
  void apply(const std::vector<torch::Tensor>& pseudo_gradient);

  // Puts back a state saved from theta(), momentum() and updates() (a server's restart). Throws
  // Error when the tensors' count or shapes are not what theta and the rule hold.
  void restore(const std::vector<torch::Tensor>& theta, const std::vector<torch::Tensor>& momentum,
               int64_t updates);

  const std::vector<torch::Tensor>& theta() const { return theta_; }
  // The rule's state besides theta, what a restart must put back: the momentum, one tensor per
  // parameter, followed for kDelayedNesterov by its buffer of arrivals, one per parameter.
  const std::vector<torch::Tensor>& momentum() const { return momentum_; }
  int64_t updates() const { return updates_; }

 private:
  AsyncOuterOptions options_;
  std::vector<torch::Tensor> theta_, momentum_;
  int64_t updates_ = 0;
};

}  // namespace agora
