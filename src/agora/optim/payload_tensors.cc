#include "agora/optim/payload_tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "agora/core/error.h"

namespace agora {
namespace {

std::vector<int64_t> checked_shape(const torch::Tensor& t) {
  if (!t.defined()) fail("payload: an undefined tensor has no values to send");
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  if (shape.empty() || shape.size() > 8) {
    fail("payload: a tensor of shape [{}] has {} dimensions; a payload entry has 1 to 8",
         fmt::join(shape, ", "), shape.size());
  }
  for (const int64_t d : shape) {
    if (d < 1)
      fail("payload: a tensor of shape [{}] has an empty dimension", fmt::join(shape, ", "));
  }
  return shape;
}

// Contiguous float32 on the CPU; may share t's storage, so callers only read it.
torch::Tensor cpu_float(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
}

void check_finite(const float* x, int64_t n, const std::vector<int64_t>& shape, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      fail("payload: a tensor of shape [{}] has the non-finite value {} at flat index {}{}",
           fmt::join(shape, ", "), x[i], i, what);
    }
  }
}

}  // namespace

TensorLayout dense_layout(const std::vector<int64_t>& shape, ValueType type) {
  TensorLayout layout;
  layout.shape = shape;
  layout.encoding = TensorEncoding::kDense;
  layout.value_type = type;
  return layout;
}

TensorLayout int8_rows_layout(const std::vector<int64_t>& shape) {
  TensorLayout layout;
  layout.shape = shape;
  layout.encoding = TensorEncoding::kInt8Rows;
  layout.value_type = ValueType::kInt8;
  return layout;
}

TensorLayout tensor_layout(const std::vector<int64_t>& shape, ValueType type) {
  switch (type) {
    case ValueType::kF32:
    case ValueType::kBF16:
      return dense_layout(shape, type);
    case ValueType::kInt8:
      return int8_rows_layout(shape);
    default:
      fail("payload: value type {} cannot carry a whole tensor (allowed: f32, bf16, int8)",
           to_string(type));
  }
}

TensorPayload dense_payload(const torch::Tensor& t, ValueType type) {
  if (type != ValueType::kF32 && type != ValueType::kBF16) {
    fail("payload: a dense entry holds f32 or bf16 values, not {}", to_string(type));
  }
  TensorPayload p;
  p.layout = dense_layout(checked_shape(t), type);
  torch::Tensor x = cpu_float(t);
  // torch's float -> bf16 conversion rounds to nearest even, as round_to_bf16 does (the tests
  // check it), and is vectorized: a gradient has as many elements as the model.
  if (type == ValueType::kBF16) x = x.to(torch::kBFloat16).to(torch::kFloat32);
  const float* data = x.data_ptr<float>();
  const int64_t n = x.numel();
  // After the rounding, so that a finite value too large for bf16 is caught too.
  check_finite(data, n, p.layout.shape, type == ValueType::kBF16 ? " (in bf16)" : "");
  p.values.assign(data, data + n);
  return p;
}

TensorPayload int8_rows_payload(const torch::Tensor& t) {
  TensorPayload p;
  p.layout = int8_rows_layout(checked_shape(t));
  const torch::Tensor x = cpu_float(t);
  const float* data = x.data_ptr<float>();
  const int64_t n = x.numel();
  check_finite(data, n, p.layout.shape, "");
  const int64_t cols = p.layout.shape.back();
  const int64_t rows = n / cols;
  p.scales.assign(rows, 0.0f);
  p.quantized.assign(n, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = data + r * cols;
    float max_abs = 0.0f;
    for (int64_t c = 0; c < cols; ++c) max_abs = std::max(max_abs, std::fabs(row[c]));
    const float scale = max_abs / 127.0f;
    p.scales[r] = scale;
    // An all-zero row keeps q = 0, so it decodes to exact zeros. (A row whose largest magnitude
    // is below 127 times the smallest float underflows to scale 0 the same way.)
    if (scale == 0.0f) continue;
    int8_t* q = p.quantized.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      // nearbyint rounds half to even in the default rounding mode, which nothing here changes.
      const float v = std::clamp(std::nearbyint(row[c] / scale), -127.0f, 127.0f);
      q[c] = static_cast<int8_t>(v);
    }
  }
  return p;
}

TensorPayload tensor_payload(const torch::Tensor& t, ValueType type) {
  return type == ValueType::kInt8 ? int8_rows_payload(t) : dense_payload(t, type);
}

torch::Tensor to_tensor(const TensorPayload& p) {
  const TensorLayout& layout = p.layout;
  int64_t n = 1;
  for (const int64_t d : layout.shape) n *= d;
  torch::Tensor out = torch::empty(layout.shape, torch::kFloat32);
  float* o = out.data_ptr<float>();
  switch (layout.encoding) {
    case TensorEncoding::kDense:
      if (static_cast<int64_t>(p.values.size()) != n) {
        fail("payload: a dense entry of shape [{}] has {} values, expected {}",
             fmt::join(layout.shape, ", "), p.values.size(), n);
      }
      std::memcpy(o, p.values.data(), n * sizeof(float));
      return out;
    case TensorEncoding::kInt8Rows: {
      const int64_t cols = layout.shape.empty() ? 1 : layout.shape.back();
      const int64_t rows = n / cols;
      if (static_cast<int64_t>(p.quantized.size()) != n ||
          static_cast<int64_t>(p.scales.size()) != rows) {
        fail(
            "payload: an int8_rows entry of shape [{}] has {} values and {} scales, expected {} "
            "and {}",
            fmt::join(layout.shape, ", "), p.quantized.size(), p.scales.size(), n, rows);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float scale = p.scales[r];
        for (int64_t c = 0; c < cols; ++c) {
          o[r * cols + c] = static_cast<float>(p.quantized[r * cols + c]) * scale;
        }
      }
      return out;
    }
    default:
      fail("payload: a {} entry is not a whole tensor (to_tensor takes dense or int8_rows)",
           to_string(layout.encoding));
  }
}

std::vector<torch::Tensor> mean_of_contributions(std::span<const Contribution> contributions,
                                                 const PayloadLayout& layout, int64_t step,
                                                 std::string_view what) {
  const std::vector<const Contribution*> ordered = canonical_order(contributions);
  std::vector<torch::Tensor> sums(layout.tensors.size());
  for (const Contribution* c : ordered) {
    Payload payload;
    try {
      payload = decode_payload(c->bytes, layout);
    } catch (const Error& e) {
      fail("{} from peer {} at step {} does not fit this model: {}", what, c->peer, step,
           e.what());
    }
    if (payload.step != static_cast<uint64_t>(step)) {
      fail("{} from peer {} is for step {}, not {}", what, c->peer, payload.step, step);
    }
    for (size_t i = 0; i < sums.size(); ++i) {
      torch::Tensor values = to_tensor(payload.tensors[i]);
      if (sums[i].defined()) {
        sums[i].add_(values);
      } else {
        sums[i] = std::move(values);
      }
    }
  }
  if (ordered.empty()) return {};
  for (torch::Tensor& sum : sums) sum.div_(static_cast<double>(ordered.size()));
  return sums;
}

}  // namespace agora
