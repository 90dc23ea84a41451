#include "agora/pipeline/boundary.h"

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

}  // namespace

BoundaryCodec boundary_codec_named(const std::string& name) {
  if (name == "float32") return BoundaryCodec::kF32;
  if (name == "bfloat16") return BoundaryCodec::kBF16;
  if (name == "int8") return BoundaryCodec::kInt8;
  if (name == "subspace") return BoundaryCodec::kSubspace;
  fail("pipeline.codec = \"{}\" is unknown (allowed: float32, bfloat16, int8, subspace)", name);
}

BoundaryCoder::BoundaryCoder(const PipelineConfig& config, int64_t hidden_size,
                             const SubspaceBasis* subspace)
    : codec_(boundary_codec_named(config.codec)),
      block_(codec_ == BoundaryCodec::kInt8 ? static_cast<uint32_t>(config.int8_block) : 0),
      width_(subspace != nullptr ? subspace->rank() : hidden_size),
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
  if (h.direction != direction || h.codec != codec_ || h.step != at.step ||
      h.micro_batch != at.micro_batch || h.stage != at.stage || h.rows != rows ||
      h.width != width_ || h.block != block_) {
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

std::string BoundaryCoder::encode_backward(const BoundaryPosition& at,
                                           const torch::Tensor& g) const {
  const int64_t rows = g.size(0) * g.size(1);
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
  const torch::Tensor g = from_floats(message.values, {batch, time, width_}, device);
  if (codec_ != BoundaryCodec::kSubspace) return g;
  return torch::matmul(g, subspace_->basis().t());
}

}  // namespace agora
