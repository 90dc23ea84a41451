// How a Llama model is cut into pipeline stages (docs/pipeline.md): contiguous runs of decoder
// layers, stage 0 also holding the token embedding and the last stage the final norm and the
// output head. Torch-free, so the coordinator and the benchmarks reason about stages without
// libtorch.
//
// What it promises: every stage holds at least one layer; the layers are covered once, in
// order; among all such cuts, the one chosen minimises the largest stage's parameter count and,
// among those, spreads the rest most evenly (the smallest sum of squared stage sizes), so the
// stages hold about 1/S of the model each, the embedding and head counting as the layers they
// outweigh. The same (model, stages) gives the same cut on
// every peer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/config/parameter_shapes.h"

namespace agora {

struct StageSpan {
  int64_t stage = 0;
  int64_t first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer)
  bool embedding = false;                  // model.embed_tokens (stage 0)
  bool head = false;                       // model.norm and lm_head (the last stage)
  int64_t parameters = 0;                  // trainable parameters the stage holds

  int64_t layers() const { return end_layer - first_layer; }
  bool operator==(const StageSpan&) const = default;
};

// Parameters of one decoder layer (norms, attention, MLP) and of the first and last stages'
// extras, with the padded vocabulary.
int64_t layer_parameters(const ModelConfig& model);
int64_t embedding_parameters(const ModelConfig& model);
int64_t head_parameters(const ModelConfig& model);

// Throws Error when stages < 1, stages > model.num_layers, or the embeddings are tied (the head
// would live on two stages).
std::vector<StageSpan> partition_model(const ModelConfig& model, int64_t stages);

// The parameters a stage holds, in the order of its stage model's hf_parameters() (the whole
// model's order, config/parameter_shapes.h, restricted to the span): what a stage's DeMo payload
// layout is made of where libtorch is not linked (the swarm coordinator's check of a round).
std::vector<ParameterShape> stage_parameter_shapes(const ModelConfig& model, const StageSpan& span);

// "0:[emb 0-1] 1:[2-3] 2:[4-5 head]" for logs.
std::string describe(const std::vector<StageSpan>& spans);

}  // namespace agora
