// ModelConfig <-> Hugging Face's config.json for LlamaForCausalLM.
//
// agora checkpoints carry a config.json that transformers reads as a LlamaConfig, so
// `LlamaForCausalLM.from_pretrained(dir)` opens them: hidden_size, intermediate_size,
// num_attention_heads, num_hidden_layers, num_key_value_heads, vocab_size (the padded size: the
// embedding's row count), max_position_embeddings, rms_norm_eps, rope_theta,
// tie_word_embeddings, hidden_act "silu", no biases, and rope_scaling {"rope_type": "yarn", ...}
// when YaRN is on. What HF has no field for (the tokenizer's own vocabulary size, log-n scaling,
// the preset name) sits under an "agora" key, which transformers keeps as an extra attribute.
//
// Reading is for untrusted files: every missing key, wrong type or out-of-range value is an Error
// naming the file and the key; the result passes ModelConfig::validate().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "agora/config/model_config.h"

namespace agora {

// `eos_token_id`: the tokenizer's end-of-text id (recorded as bos and eos for generation).
std::string to_hf_config_json(const ModelConfig& config, int64_t eos_token_id);

ModelConfig from_hf_config_json(std::string_view json_text, std::string_view source_name);

}  // namespace agora
