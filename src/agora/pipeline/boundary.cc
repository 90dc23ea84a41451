#include "agora/pipeline/boundary.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "agora/core/error.h"

namespace agora {
namespace {

std::vector<float> to_floats(const torch::Tensor& t) {
  const torch::Tensor flat = t.detach().to(torch::kCPU, torch::kFloat32).contiguous().view({-1});
  return std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
}

torch::Tensor from_floats(std::vector<float>& values, std::vector<int64_t> shape,
                          torch::Device device) {
  return torch::from_blob(values.data(), shape, torch::kFloat32).clone().to(device);
}

// The columns codec's forward rule: the `k` columns of the rows x d matrix `m` with the largest
// sums of squares, among those that are not all zero (ties to the lower index), in increasing
// order; column 0 alone when every column is zero. Summed in double in a fixed order, so every
// process picks the same columns whatever its thread count.
std::vector<uint32_t> largest_columns(const std::vector<float>& m, int64_t d, int64_t k) {
  const size_t rows = m.size() / static_cast<size_t>(d);
  std::vector<double> norm(static_cast<size_t>(d), 0.0);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = m.data() + r * static_cast<size_t>(d);
    for (int64_t c = 0; c < d; ++c) norm[static_cast<size_t>(c)] += double{row[c]} * row[c];
  }
  std::vector<uint32_t> order;
  for (int64_t c = 0; c < d; ++c) {
    if (norm[static_cast<size_t>(c)] > 0) order.push_back(static_cast<uint32_t>(c));
  }
  const size_t keep = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
      [&](uint32_t a, uint32_t b) { return norm[a] != norm[b] ? norm[a] > norm[b] : a < b; });
  order.resize(keep);
  if (order.empty()) order.push_back(0);
  std::sort(order.begin(), order.end());
  return order;
}

// The columns of `m` (rows x d) that hold a nonzero value; column 0 alone when none does. On a
// decoded columns message these are exactly the columns the sender kept.
std::vector<uint32_t> nonzero_columns(const std::vector<float>& m, int64_t d) {
  std::vector<char> any(static_cast<size_t>(d), 0);
  for (size_t i = 0; i < m.size(); ++i) any[i % static_cast<size_t>(d)] |= m[i] != 0.0f;
  std::vector<uint32_t> out;
  for (int64_t c = 0; c < d; ++c) {
    if (any[static_cast<size_t>(c)]) out.push_back(static_cast<uint32_t>(c));
  }
  if (out.empty()) out.push_back(0);
  return out;
}

std::vector<float> select_columns(const std::vector<float>& m, int64_t d,
                                  const std::vector<uint32_t>& columns) {
  const size_t rows = m.size() / static_cast<size_t>(d);
  std::vector<float> out;
  out.reserve(rows * columns.size());
  for (size_t r = 0; r < rows; ++r) {
    for (const uint32_t c : columns) out.push_back(m[r * static_cast<size_t>(d) + c]);
  }
  return out;
}

// A decoded columns message as the dense [shape..., d] tensor, zero outside its columns.
torch::Tensor scatter_columns(const BoundaryMessage& message, std::vector<int64_t> shape,
                              torch::Device device) {
  const BoundaryHeader& h = message.header;
  std::vector<float> dense(size_t{h.rows} * h.block, 0.0f);
  for (size_t r = 0; r < h.rows; ++r) {
    for (size_t c = 0; c < h.width; ++c) {
      dense[r * h.block + message.columns[c]] = message.values[r * h.width + c];
    }
  }
  shape.push_back(h.block);
  return from_floats(dense, shape, device);
}

}  // namespace

BoundaryCodec boundary_codec_named(const std::string& name) {
  if (name == "float32") return BoundaryCodec::kF32;
  if (name == "bfloat16") return BoundaryCodec::kBF16;
  if (name == "int8") return BoundaryCodec::kInt8;
  if (name == "subspace") return BoundaryCodec::kSubspace;
  if (name == "columns") return BoundaryCodec::kColumns;
  fail("pipeline.codec = \"{}\" is unknown (allowed: float32, bfloat16, int8, subspace, columns)",
       name);
}

BoundaryCoder::BoundaryCoder(const PipelineConfig& config, int64_t hidden_size,
                             const SubspaceBasis* subspace)
    : codec_(boundary_codec_named(config.codec)),
      block_(codec_ == BoundaryCodec::kInt8      ? static_cast<uint32_t>(config.int8_block)
             : codec_ == BoundaryCodec::kColumns ? static_cast<uint32_t>(hidden_size)
                                                 : 0),
      width_(subspace != nullptr ? subspace->rank()
             : codec_ == BoundaryCodec::kColumns
                 ? std::clamp<int64_t>(
                       std::llround(config.columns_kept * static_cast<double>(hidden_size)), 1,
                       hidden_size)
                 : hidden_size),
      hidden_(hidden_size),
      subspace_(subspace) {
  if ((codec_ == BoundaryCodec::kSubspace) != (subspace != nullptr)) {
    fail("BoundaryCoder: codec {} needs {} subspace basis", config.codec,
         subspace == nullptr ? "a" : "no");
  }
}

BoundaryHeader BoundaryCoder::header(BoundaryDirection direction, const BoundaryPosition& at,
                                     int64_t rows, int64_t width) const {
  BoundaryHeader h;
  h.direction = direction;
  h.codec = codec_;
  h.step = at.step;
  h.micro_batch = at.micro_batch;
  h.stage = at.stage;
  h.rows = static_cast<uint32_t>(rows);
  h.width = static_cast<uint32_t>(width);
  h.block = block_;
  return h;
}

BoundaryMessage BoundaryCoder::decode(std::string_view bytes, BoundaryDirection direction,
                                      const BoundaryPosition& at, int64_t rows) const {
  BoundaryMessage message = decode_boundary(bytes);
  const BoundaryHeader& h = message.header;
  // A columns message may keep fewer columns than the most it may (all-zero ones are not sent).
  const bool width_ok = codec_ == BoundaryCodec::kColumns ? h.width <= width_ : h.width == width_;
  if (h.direction != direction || h.codec != codec_ || h.step != at.step ||
      h.micro_batch != at.micro_batch || h.stage != at.stage || h.rows != rows || !width_ok ||
      h.block != block_) {
    fail(
        "boundary message (direction {}, step {}, micro-batch {}, from stage {}, {} x {} values, "
        "codec {}, block {}) is not the one expected (direction {}, step {}, micro-batch {}, "
        "from stage {}, {} x {} values, codec {}, block {})",
        static_cast<int>(h.direction), h.step, h.micro_batch, h.stage, h.rows, h.width,
        static_cast<int>(h.codec), h.block, static_cast<int>(direction), at.step, at.micro_batch,
        at.stage, rows, width_, static_cast<int>(codec_), block_);
  }
  return message;
}

std::string BoundaryCoder::encode_forward(const BoundaryPosition& at, const torch::Tensor& x,
                                          const torch::Tensor& tokens) const {
  const int64_t rows = x.size(0) * x.size(1);
  if (codec_ == BoundaryCodec::kColumns) {
    const std::vector<float> all = to_floats(x);
    const std::vector<uint32_t> columns = largest_columns(all, hidden_, width_);
    const auto kept = static_cast<int64_t>(columns.size());
    return encode_boundary(header(BoundaryDirection::kForward, at, rows, kept),
                           select_columns(all, hidden_, columns), {}, columns);
  }
  if (codec_ != BoundaryCodec::kSubspace) {
    const std::vector<float> values = to_floats(x);
    return encode_boundary(header(BoundaryDirection::kForward, at, rows, x.size(2)), values, {});
  }
  const std::vector<float> values = to_floats(subspace_->coefficients(x.detach(), tokens));
  const torch::Tensor ids = tokens.to(torch::kCPU, torch::kInt64).contiguous().view({-1});
  std::vector<uint32_t> token_ids(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i)
    token_ids[static_cast<size_t>(i)] = static_cast<uint32_t>(ids.data_ptr<int64_t>()[i]);
  return encode_boundary(header(BoundaryDirection::kForward, at, rows, subspace_->rank()), values,
                         token_ids);
}

torch::Tensor BoundaryCoder::decode_forward(std::string_view bytes, const BoundaryPosition& at,
                                            const torch::Tensor& tokens,
                                            torch::Device device) const {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  BoundaryMessage message = decode(bytes, BoundaryDirection::kForward, at, B * T);
  if (codec_ == BoundaryCodec::kColumns) return scatter_columns(message, {B, T}, device);
  if (codec_ != BoundaryCodec::kSubspace)
    return from_floats(message.values, {B, T, width_}, device);
  // The ids travel with the coefficients; a receiver that knows the micro-batch's tokens (its
  // own copy of the data) insists they agree, so a sender cannot shift E_fix under it.
  const torch::Tensor expected = tokens.to(torch::kCPU, torch::kInt64).contiguous().view({-1});
  for (int64_t i = 0; i < B * T; ++i) {
    if (message.tokens[static_cast<size_t>(i)] !=
        static_cast<uint64_t>(expected.data_ptr<int64_t>()[i])) {
      fail("boundary message for step {} micro-batch {}: token {} is {}, expected {}", at.step,
           at.micro_batch, i, message.tokens[static_cast<size_t>(i)],
           expected.data_ptr<int64_t>()[i]);
    }
  }
  const torch::Tensor c = from_floats(message.values, {B, T, width_}, device);
  return subspace_->reconstruct(c, tokens.to(device));
}

std::string BoundaryCoder::encode_backward(const BoundaryPosition& at, const torch::Tensor& g,
                                           const torch::Tensor& input) const {
  const int64_t rows = g.size(0) * g.size(1);
  if (codec_ == BoundaryCodec::kColumns) {
    const std::vector<uint32_t> columns = nonzero_columns(to_floats(input), hidden_);
    const auto kept = static_cast<int64_t>(columns.size());
    return encode_boundary(header(BoundaryDirection::kBackward, at, rows, kept),
                           select_columns(to_floats(g), hidden_, columns), {}, columns);
  }
  if (codec_ != BoundaryCodec::kSubspace) {
    return encode_boundary(header(BoundaryDirection::kBackward, at, rows, g.size(2)), to_floats(g),
                           {});
  }
  const std::vector<float> values = to_floats(torch::matmul(g, subspace_->basis()));
  return encode_boundary(header(BoundaryDirection::kBackward, at, rows, subspace_->rank()), values,
                         {});
}

torch::Tensor BoundaryCoder::decode_backward(std::string_view bytes, const BoundaryPosition& at,
                                             int64_t batch, int64_t time,
                                             torch::Device device) const {
  BoundaryMessage message = decode(bytes, BoundaryDirection::kBackward, at, batch * time);
  if (codec_ == BoundaryCodec::kColumns) return scatter_columns(message, {batch, time}, device);
  const torch::Tensor g = from_floats(message.values, {batch, time, width_}, device);
  if (codec_ != BoundaryCodec::kSubspace) return g;
  return torch::matmul(g, subspace_->basis().t());
}

}  // namespace agora
