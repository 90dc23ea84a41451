// One pipeline stage's part of the Llama model (docs/pipeline.md): the layers of its StageSpan,
// plus the token embedding on stage 0 and the final norm and output head on the last stage.
// A stage process holds only this, and its optimizer state: about 1/S of the model.
//
//   stage 0:      tokens [B, T]  -> embed (+ E_fix[token] with a subspace) -> layers -> x [B, T, d]
//   middle:       x [B, T, d]    -> layers -> x
//   last stage:   x [B, T, d]    -> layers -> norm -> lm_head -> logits [B, T, V]
//
// Its parameters carry the whole model's Hugging Face names (model.layers.<global index>...), so
// the stages' checkpoints together are one LlamaForCausalLM checkpoint. Each parameter is drawn
// from its own seeded stream (subspace.h, seeded_generator), so a stage initialises its own part
// without the rest of the model and the same (config, seed) gives the same bits however the model
// is cut. The scheme is the whole model's (llama.cc): Normal(0, init_std), residual projections
// scaled by 1/sqrt(2L), norm gains 1.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/model/llama.h"
#include "agora/optim/strategy.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/subspace.h"

namespace agora {

class StageModelImpl : public torch::nn::Module {
 public:
  // `subspace` (may be null) must outlive the stage; with it, stage 0 adds E_fix[token] to its
  // embedding and constrain_to_subspace() keeps what the stage writes in span(U).
  StageModelImpl(const ModelConfig& config, const StageSpan& span, uint64_t seed,
                 const SubspaceBasis* subspace);

  // Stage 0 takes token ids [B, T] (int64), the others activations [B, T, d]. Returns the
  // activations after the stage's layers, or the logits on the last stage.
  torch::Tensor forward(const torch::Tensor& input);

  const StageSpan& span() const { return span_; }
  bool first() const { return span_.embedding; }
  bool last() const { return span_.head; }

  // The stage's parameters with the whole model's names, in the whole model's order; `decay` is
  // false for norm gains (the trainer's rule).
  std::vector<NamedParameter> hf_parameters() const;

  // W <- U U^T W for every matrix that writes into the residual stream (o_proj, down_proj: their
  // output rows) and E <- E U U^T for the trainable embedding, so the stage's output stays
  // E_fix[token] + span(U). A no-op without a subspace and on the last stage, whose output is
  // not sent on. Called at construction and after every update.
  void constrain_to_subspace();

  // Writes this stage's parameters into `whole` (the same names); with a subspace the embedding
  // written is E_fix + E, which is what stage 0 computes, so `whole` computes what the stages do.
  void copy_into(Llama& whole) const;
  // Reads this stage's parameters from `whole` (tests: start stages from a given model).
  void copy_from(const Llama& whole);

 private:
  ModelConfig config_;
  StageSpan span_;
  const SubspaceBasis* subspace_;
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(StageModel);

// The stage's state hash, in hex: BLAKE2b-256 of its parameters' hashes in order, each the
// BLAKE2b-256 of its float32 bytes (train/parameter_hash.h's scheme over the stage's part).
std::string stage_parameter_hash(const StageModel& stage);

}  // namespace agora
