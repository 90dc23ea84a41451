// Payload tensors: the conversions between torch tensors and the dense and int8_rows entries of a
// payload (optim/payload.h), for the strategies that send whole tensors (all-reduce AdamW sends
// gradients, DiLoCo pseudo-gradients).
//
// What they promise:
//   - dense f32 is exact; dense bf16 holds each value rounded to the nearest bf16 (ties to even,
//     the same as round_to_bf16), so encode(decode) is bit-exact;
//   - int8_rows cuts the tensor into rows (the product of all dimensions but the last, 1 for a
//     1-D tensor) with scale = max|x| / 127 per row and q = x / scale rounded half to even and
//     clamped to [-127, 127]; an all-zero row has scale 0 and q 0, so it decodes to exact zeros,
//     and every other element decodes within scale / 2 (plus float rounding) of its value;
//   - to_tensor() gives a new float32 CPU tensor of the entry's shape (int8 as q * scale, in
//     float32), computed the same way on every machine, so peers that decode the same bytes hold
//     the same values;
//   - a tensor with a non-finite element, or a shape a payload cannot describe (no dimensions,
//     more than 8, an empty one), is an Error naming it: NaN must not reach the wire.
//
// The layout helpers give the TensorLayout a strategy expects, for decode_payload(bytes, layout).
#pragma once

#include <torch/torch.h>

#include <span>
#include <string_view>
#include <vector>

#include "agora/optim/payload.h"
#include "agora/optim/strategy.h"

namespace agora {

// A dense entry of `t`'s values; `type` is kF32 or kBF16.
TensorPayload dense_payload(const torch::Tensor& t, ValueType type);
// An int8_rows entry of `t`'s values (see above).
TensorPayload int8_rows_payload(const torch::Tensor& t);
// dense_payload for kF32 and kBF16, int8_rows_payload for kInt8.
TensorPayload tensor_payload(const torch::Tensor& t, ValueType type);
// The values of a dense or int8_rows entry as a float32 CPU tensor of its shape; Error otherwise.
torch::Tensor to_tensor(const TensorPayload& p);

TensorLayout dense_layout(const std::vector<int64_t>& shape, ValueType type);
TensorLayout int8_rows_layout(const std::vector<int64_t>& shape);
// The layout of a tensor sent as `type`: dense for kF32 and kBF16, int8_rows for kInt8.
TensorLayout tensor_layout(const std::vector<int64_t>& shape, ValueType type);

// The element-wise mean of the non-empty `contributions`, one float32 CPU tensor per entry of
// `layout`: summed in fp32 in the canonical order, so every peer gets the same bits; decoded one
// contribution at a time, so one payload is held at once. Empty when every contribution is empty.
// Throws Error, naming the peer, for a contribution that does not decode to `layout` or carries
// another step; `what` names the sender's payload in that message ("adamw: ... the gradient").
std::vector<torch::Tensor> mean_of_contributions(std::span<const Contribution> contributions,
                                                 const PayloadLayout& layout, int64_t step,
                                                 std::string_view what);

}  // namespace agora
