#include "agora/config/hf_config.h"

#include <nlohmann/json.hpp>

#include "agora/core/error.h"

namespace agora {

std::string to_hf_config_json(const ModelConfig& c, int64_t eos_token_id) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_heads;
  j["num_hidden_layers"] = c.num_layers;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim();
  j["vocab_size"] = c.padded_vocab_size();
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = c.init_std;
  j["bos_token_id"] = eos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["torch_dtype"] = "float32";
  if (c.yarn_factor > 1.0) {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", c.yarn_factor},
                         {"original_max_position_embeddings", c.yarn_original_max_seq_len},
                         {"beta_fast", c.yarn_beta_fast},
                         {"beta_slow", c.yarn_beta_slow}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["agora"] = {{"preset", c.preset},
                {"vocab_size", c.vocab_size},
                {"logn_attention_scaling", c.logn_attention_scaling}};
  return j.dump(2) + "\n";
}

namespace {

class Reader {
 public:
  Reader(const nlohmann::json& j, std::string_view source) : j_(j), source_(source) {}

  int64_t integer(const char* key) const {
    const auto& v = at(key);
    if (!v.is_number_integer()) fail("{}: {} must be an integer, got {}", source_, key, v.dump());
    return v.get<int64_t>();
  }
  double number(const char* key) const {
    const auto& v = at(key);
    if (!v.is_number()) fail("{}: {} must be a number, got {}", source_, key, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!j_.contains(key)) return fallback;
    const auto& v = j_[key];
    if (!v.is_boolean()) fail("{}: {} must be true or false, got {}", source_, key, v.dump());
    return v.get<bool>();
  }
  const nlohmann::json& at(const char* key) const {
    if (!j_.contains(key)) fail("{}: missing key '{}'", source_, key);
    return j_[key];
  }

 private:
  const nlohmann::json& j_;
  std::string source_;
};

}  // namespace

ModelConfig from_hf_config_json(std::string_view json_text, std::string_view source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object (a Hugging Face config.json)", source);
  if (j.contains("model_type") && j["model_type"] != "llama") {
    fail("{}: model_type is {}, expected \"llama\"", source, j["model_type"].dump());
  }
  const Reader r(j, source);
  ModelConfig c;
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_heads = r.integer("num_attention_heads");
  c.num_layers = r.integer("num_hidden_layers");
  c.num_kv_heads =
      j.contains("num_key_value_heads") ? r.integer("num_key_value_heads") : c.num_heads;
  c.vocab_size = r.integer("vocab_size");
  c.max_seq_len = r.integer("max_position_embeddings");
  c.rms_norm_eps = r.number("rms_norm_eps");
  c.rope_theta = j.contains("rope_theta") ? r.number("rope_theta") : 10000.0;
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    fail("{}: hidden_act is {}, agora's model uses \"silu\"", source, j["hidden_act"].dump());
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (r.boolean(bias, false)) fail("{}: {} is true, agora's model has no biases", source, bias);
  }
  // Compared by division: head_dim * num_heads overflows for hostile values.
  if (j.contains("head_dim") && !j["head_dim"].is_null() && c.num_heads > 0 &&
      (c.hidden_size % c.num_heads != 0 || r.integer("head_dim") != c.hidden_size / c.num_heads)) {
    fail("{}: head_dim {} times num_attention_heads {} is not hidden_size {}", source,
         r.integer("head_dim"), c.num_heads, c.hidden_size);
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const auto& rs = j["rope_scaling"];
    if (!rs.is_object()) fail("{}: rope_scaling must be an object or null", source);
    std::string type;  // HF writes "rope_type"; older configs "type"
    for (const char* key : {"rope_type", "type"}) {
      if (!rs.contains(key)) continue;
      if (!rs[key].is_string()) {
        fail("{}: rope_scaling.{} is {}, expected a string (allowed: \"yarn\")", source, key,
             rs[key].dump());
      }
      type = rs[key].get<std::string>();
      break;
    }
    if (type != "yarn")
      fail("{}: rope_scaling type '{}' is not supported (allowed: yarn)", source, type);
    const Reader y(rs, std::string(source) + " rope_scaling");
    c.yarn_factor = y.number("factor");
    c.yarn_original_max_seq_len = y.integer("original_max_position_embeddings");
    if (rs.contains("beta_fast")) c.yarn_beta_fast = y.number("beta_fast");
    if (rs.contains("beta_slow")) c.yarn_beta_slow = y.number("beta_slow");
  }
  if (j.contains("agora")) {
    const auto& a = j["agora"];
    if (!a.is_object()) fail("{}: the agora key must be an object", source);
    const Reader ar(a, std::string(source) + " agora");
    if (a.contains("vocab_size")) {
      const int64_t unpadded = ar.integer("vocab_size");
      if (unpadded <= 0 || (unpadded + 63) / 64 * 64 != c.vocab_size) {
        fail("{}: agora.vocab_size {} does not pad to vocab_size {}", source, unpadded,
             c.vocab_size);
      }
      c.vocab_size = unpadded;
    }
    c.logn_attention_scaling = ar.boolean("logn_attention_scaling", false);
    if (a.contains("preset") && a["preset"].is_string()) c.preset = a["preset"].get<std::string>();
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  // A padded vocabulary must stay what the embedding has.
  if (!j.contains("agora") && c.padded_vocab_size() != c.vocab_size) {
    fail("{}: vocab_size {} is not a multiple of 64; agora pads vocabularies to one", source,
         c.vocab_size);
  }
  return c;
}

}  // namespace agora
