// Fuzz target for config.json from checkpoints (untrusted: a peer or a download may hand one
// over). from_hf_config_json either returns a config that passes validate() and round-trips
// through to_hf_config_json, or throws agora::Error; nothing else.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agora/config/hf_config.h"
#include "agora/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  agora::ModelConfig config;
  try {
    config = agora::from_hf_config_json(text, "fuzz");
  } catch (const agora::Error&) {
    return 0;
  }
  config.validate();  // must not throw for an accepted config
  const agora::ModelConfig again =
      agora::from_hf_config_json(agora::to_hf_config_json(config, 0), "round trip");
  if (again.hidden_size != config.hidden_size || again.vocab_size != config.vocab_size ||
      again.num_kv_heads != config.num_kv_heads || again.yarn_factor != config.yarn_factor ||
      again.tie_embeddings != config.tie_embeddings) {
    std::abort();
  }
  return 0;
}
