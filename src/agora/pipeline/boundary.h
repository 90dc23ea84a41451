// Tensors across a stage boundary (docs/pipeline.md, "Compressed boundaries"): the torch side of
// the wire codec (boundary_codec.h). The sender encodes its output activations (forward) or the
// gradient of its input (backward) into the bytes a neighbour receives; the receiver decodes them
// into the tensor it computes with. Whatever the codec loses, it loses here, so a simulated
// pipeline and one over the network compute with the same numbers.
//
//   float32   exact
//   bfloat16  each value rounded to bf16 (round to nearest even)
//   int8      blockwise absmax: each value within half its block's step (absmax / 127 / 2)
//   subspace  forward c = U^T (x - E_fix[token]) and the token ids, rebuilt as E_fix + U c (exact
//             when x - E_fix[token] lies in span(U)); backward U^T g, rebuilt as U U^T g, which is
//             exactly the gradient every upstream parameter receives through c
//   columns   a column-space sparsifier: forward, of the micro-batch's rows x d activations,
//             the k = round(columns_kept * d) columns with the largest sums of squares (over all
//             its tokens; all-zero columns never, ties to the lower index), every other column
//             received as 0; backward, the gradient of exactly those columns (the receiver reads
//             them off its input: its nonzero columns), which is the exact gradient of the
//             masked forward, so what reaches upstream parameters is the true gradient of what
//             was computed. Indices cost 4 bytes per kept column per message.
#pragma once

#include <torch/torch.h>

#include <string>
#include <string_view>

#include "agora/config/run_config.h"
#include "agora/pipeline/boundary_codec.h"
#include "agora/pipeline/subspace.h"

namespace agora {

// Where a message belongs: the step, micro-batch and sending stage it carries.
struct BoundaryPosition {
  uint64_t step = 0;
  uint32_t micro_batch = 0;
  uint32_t stage = 0;  // the sender's stage
};

class BoundaryCoder {
 public:
  // `subspace` must be non-null exactly when config.codec is "subspace", and outlive the coder.
  BoundaryCoder(const PipelineConfig& config, int64_t hidden_size, const SubspaceBasis* subspace);

  BoundaryCodec codec() const { return codec_; }

  // x [B, T, d] float32, tokens [B, T] (the micro-batch's input ids; used by subspace only).
  std::string encode_forward(const BoundaryPosition& at, const torch::Tensor& x,
                             const torch::Tensor& tokens) const;
  // The activations [batch, time, d] the receiver computes with. `tokens` are the ids the
  // receiver expects (subspace messages must carry exactly these; others carry none). Throws
  // Error when the bytes do not decode, or do not match the position, direction or shape.
  torch::Tensor decode_forward(std::string_view bytes, const BoundaryPosition& at,
                               const torch::Tensor& tokens, torch::Device device) const;

  // g [B, T, d]: the loss's gradient with respect to the receiver's input, `input` [B, T, d]
  // (what decode_forward gave: the columns codec sends the gradient of its nonzero columns).
  std::string encode_backward(const BoundaryPosition& at, const torch::Tensor& g,
                              const torch::Tensor& input) const;
  torch::Tensor decode_backward(std::string_view bytes, const BoundaryPosition& at, int64_t batch,
                                int64_t time, torch::Device device) const;

 private:
  BoundaryHeader header(BoundaryDirection direction, const BoundaryPosition& at, int64_t rows,
                        int64_t width) const;
  BoundaryMessage decode(std::string_view bytes, BoundaryDirection direction,
                         const BoundaryPosition& at, int64_t rows) const;

  BoundaryCodec codec_;
  uint32_t block_;
  int64_t width_;  // values per token on the wire: hidden_size, the subspace's rank, or at most
                   // the columns kept
  int64_t hidden_;
  const SubspaceBasis* subspace_;
};

BoundaryCodec boundary_codec_named(const std::string& name);

}  // namespace agora
