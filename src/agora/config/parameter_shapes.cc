#include "agora/config/parameter_shapes.h"

namespace agora {

std::vector<ParameterShape> parameter_shapes(const ModelConfig& m) {
  const int64_t d = m.hidden_size, kv = m.num_kv_heads * m.head_dim(), h = m.intermediate_size;
  const int64_t v = m.padded_vocab_size();
  std::vector<ParameterShape> out = {{"model.embed_tokens.weight", {v, d}}};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {d, d}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    out.push_back({p + "self_attn.o_proj.weight", {d, d}});
    out.push_back({p + "mlp.gate_proj.weight", {h, d}});
    out.push_back({p + "mlp.up_proj.weight", {h, d}});
    out.push_back({p + "mlp.down_proj.weight", {d, h}});
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
  }
  out.push_back({"model.norm.weight", {d}});
  if (!m.tie_embeddings) out.push_back({"lm_head.weight", {v, d}});
  return out;
}

}  // namespace agora
