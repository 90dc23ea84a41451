#include "agora/optim/payload_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "agora/core/error.h"

namespace agora {
namespace {

bool negative(float v) {
  return v < 0.0f;
}  // as the one-bit encoding decides

// Element i of a dense or int8_rows entry, as a float.
float dense_value(const TensorPayload& t, int64_t i) {
  if (t.layout.encoding == TensorEncoding::kInt8Rows) {
    const int64_t row_length = t.layout.shape.back();
    return static_cast<float>(t.quantized[static_cast<size_t>(i)]) *
           t.scales[static_cast<size_t>(i / row_length)];
  }
  return t.values[static_cast<size_t>(i)];
}

struct Sums {
  int64_t selections = 0, shared = 0, same_sign = 0;
  double diff2 = 0, norm2 = 0;  // over values that are numbers (not one-bit)
  bool has_values = false;
};

Sums compare_topk(const TensorPayload& a, const TensorPayload& b) {
  Sums s;
  s.has_values = a.layout.value_type != ValueType::kOneBit;
  const size_t k = static_cast<size_t>(a.layout.topk);
  const size_t chunks = static_cast<size_t>(a.layout.num_chunks());
  for (size_t c = 0; c < chunks; ++c) {
    // Both chunks' positions are ascending (decoding checks it): a merge finds the shared ones.
    size_t i = c * k, j = c * k;
    const size_t end = c * k + k;
    while (i < end && j < end) {
      if (a.positions[i] < b.positions[j]) {
        ++i;
      } else if (b.positions[j] < a.positions[i]) {
        ++j;
      } else {
        ++s.shared;
        s.same_sign += negative(a.values[i]) == negative(b.values[j]);
        if (s.has_values) {
          const double d = static_cast<double>(a.values[i]) - b.values[j];
          s.diff2 += d * d;
          s.norm2 += static_cast<double>(b.values[j]) * b.values[j];
        }
        ++i;
        ++j;
      }
    }
  }
  s.selections = static_cast<int64_t>(chunks * k);
  return s;
}

Sums compare_dense(const TensorPayload& a, const TensorPayload& b) {
  Sums s;
  s.has_values = true;
  const int64_t n = a.layout.value_count();
  for (int64_t i = 0; i < n; ++i) {
    const float x = dense_value(a, i), y = dense_value(b, i);
    s.same_sign += negative(x) == negative(y);
    const double d = static_cast<double>(x) - y;
    s.diff2 += d * d;
    s.norm2 += static_cast<double>(y) * y;
  }
  s.selections = s.shared = n;
  return s;
}

}  // namespace

double PayloadAgreement::overlap() const {
  return selections == 0 ? 1.0 : static_cast<double>(shared) / static_cast<double>(selections);
}

double PayloadAgreement::sign_agreement() const {
  return shared == 0 ? 1.0 : static_cast<double>(same_sign) / static_cast<double>(shared);
}

PayloadAgreement compare_payloads(const Payload& claimed, const Payload& recomputed) {
  if (claimed.kind != recomputed.kind) {
    throw Error(fmt::format("cannot compare payloads: the claimed one is {}, the recomputed one {}",
                            to_string(claimed.kind), to_string(recomputed.kind)));
  }
  if (claimed.step != recomputed.step) {
    throw Error(
        fmt::format("cannot compare payloads: the claimed one is for step {}, the "
                    "recomputed one for step {}",
                    claimed.step, recomputed.step));
  }
  if (claimed.tensors.size() != recomputed.tensors.size()) {
    throw Error(fmt::format("cannot compare payloads: {} tensors claimed, {} recomputed",
                            claimed.tensors.size(), recomputed.tensors.size()));
  }
  PayloadAgreement out;
  out.identical = claimed == recomputed;
  double diff2 = 0, norm2 = 0;
  out.dense = true;
  for (size_t t = 0; t < claimed.tensors.size(); ++t) {
    const TensorPayload& a = claimed.tensors[t];
    const TensorPayload& b = recomputed.tensors[t];
    if (!(a.layout == b.layout)) {
      throw Error(
          fmt::format("cannot compare payloads: tensor {} has another layout (encoding "
                      "{} against {}, {} values against {})",
                      t, to_string(a.layout.encoding), to_string(b.layout.encoding),
                      a.layout.value_count(), b.layout.value_count()));
    }
    out.dense = out.dense && a.layout.encoding != TensorEncoding::kDctTopK;
    const Sums s =
        a.layout.encoding == TensorEncoding::kDctTopK ? compare_topk(a, b) : compare_dense(a, b);
    out.selections += s.selections;
    out.shared += s.shared;
    out.same_sign += s.same_sign;
    diff2 += s.diff2;
    norm2 += s.norm2;
    out.has_values = out.has_values || s.has_values;
    if (s.selections > 0) {
      out.worst_overlap = std::min(
          out.worst_overlap, static_cast<double>(s.shared) / static_cast<double>(s.selections));
    }
  }
  // Nothing to measure against (all shared values zero): equal is exact, anything else is all off.
  out.relative_error = norm2 > 0 ? std::sqrt(diff2 / norm2) : (diff2 > 0 ? INFINITY : 0.0);
  return out;
}

bool agrees(const PayloadAgreement& a, const AgreementTolerance& tolerance) {
  if (a.identical) return true;
  if (a.has_values && !(a.relative_error <= tolerance.max_relative_error)) return false;
  if (a.dense) return true;
  return a.overlap() >= tolerance.min_overlap && a.worst_overlap >= tolerance.min_overlap &&
         a.sign_agreement() >= tolerance.min_sign_agreement;
}

bool momentum_agrees(double relative_state_error, const AgreementTolerance& tolerance) {
  return relative_state_error <= tolerance.max_state_error;  // false for NaN
}

std::string describe(const PayloadAgreement& a) {
  if (a.identical) return "identical";
  return fmt::format("overlap {:.4f} (worst tensor {:.4f}), signs {:.4f}, relative error {:.3g}",
                     a.overlap(), a.worst_overlap, a.sign_agreement(), a.relative_error);
}

}  // namespace agora
