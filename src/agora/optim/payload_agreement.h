// Payload agreement: how close a contribution a peer sent is to the one a verifier recomputed
// from the same committed inputs (the run's parameters at the step, the author's strategy state
// before it, the author's assigned sequences).
//
// Recomputation is bit-exact when the two machines sum floats in the same order; with another
// thread count or BLAS the gradient differs in its last bits, and DeMo's top-k can then pick a
// different coefficient where two are nearly tied, and a one-bit value can flip where a
// coefficient is nearly zero. So a spot check compares in coefficient space, by two numbers that
// an honest recomputation keeps near 1 and a peer that did not do the work cannot:
//
//   overlap         the share of the claimed selections (chunk, position) that the recomputation
//                   selected too, over every tensor;
//   sign agreement  among the shared selections, the share whose values have the same sign.
//
// Dense payloads (all-reduce gradients, DiLoCo pseudo-gradients, int8 rows dequantized) have no
// selections: every element is shared, and the relative error ||claimed - recomputed|| /
// ||recomputed|| is reported instead (overlap 1, sign agreement over all elements).
//
// Where the thresholds come from (measured across thread counts, and against lazy peers) is
// docs/verification.md; bench/verify measures them. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "agora/optim/payload.h"

namespace agora {

struct PayloadAgreement {
  bool identical = false;      // equal contents (floats compared as numbers: +0 equals -0)
  bool dense = false;          // no tensor had selections: judged by relative_error alone
  int64_t selections = 0;      // the claimed payload's selections (dense: its elements)
  int64_t shared = 0;          // of those, also in the recomputation
  int64_t same_sign = 0;       // of the shared, with the same sign (0 counts as positive)
  double worst_overlap = 1.0;  // the lowest overlap of any one tensor
  // ||claimed - recomputed|| / ||recomputed|| over the shared values of the tensors whose values
  // are numbers (dense, float or bf16 top-k); one-bit values carry only signs and are left out.
  double relative_error = 0.0;
  bool has_values = false;  // some tensor's values entered relative_error

  double overlap() const;         // shared / selections (1 when there is nothing to select)
  double sign_agreement() const;  // same_sign / shared (1 when nothing is shared)
};

// What a verifier accepts: identical payloads; otherwise every selection check and, where values
// are numbers, relative_error <= max_relative_error (else a claim could keep the honest positions
// and signs and scale the values). Selections: overlap() and worst_overlap both >= min_overlap
// (the work skipped on a small tensor would hide in a sum over large ones), and sign_agreement()
// >= min_sign_agreement. The momentum a claim goes on with is judged apart: momentum_agrees() on
// train/recompute.h's relative_state_error().
//
// The defaults are DeMo's, from bench/verify (docs/results.md, "Verification by recomputation"):
// honest recomputations across thread counts and BLAS kernels kept overlap and signs at exactly 1
// and their momentum within 2e-7 of the author's; every lazy claim but one had an overlap of 0.78
// or less, and that one (a gradient from perturbed parameters, overlap up to 0.992) a momentum
// error of 0.012 or more. The bound on the values' relative error is not measured yet.
struct AgreementTolerance {
  double min_overlap = 0.99;
  double min_sign_agreement = 0.99;
  double max_relative_error = 0.05;
  double max_state_error = 1e-4;
};

// Compares a claimed payload with the recomputed one. Throws Error, naming the tensor and field,
// when they cannot be compared: another kind, step, tensor count or tensor layout. A claimed
// payload that does not even have the run's layout never reaches here (decoding with the
// expected layout refuses it first).
PayloadAgreement compare_payloads(const Payload& claimed, const Payload& recomputed);

bool agrees(const PayloadAgreement& agreement, const AgreementTolerance& tolerance);
bool momentum_agrees(double relative_state_error, const AgreementTolerance& tolerance);

// "overlap 0.998, signs 1.000" (and the relative error for dense payloads): for logs and evidence.
std::string describe(const PayloadAgreement& agreement);

}  // namespace agora
