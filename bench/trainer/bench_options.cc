#include "bench_options.h"

#include <cmath>

#include "agora/core/error.h"

namespace agora::bench {

const PresetDefaults& defaults_for(const std::string& name) {
  for (const PresetDefaults& d : kPresetDefaults) {
    if (name == d.name) return d;
  }
  model_preset(name, 8192, 64);  // throws the list of presets for an unknown name
  fail("bench_trainer has no defaults for preset '{}'", name);
}

Shape shape_for(const Options& o, const std::string& preset) {
  const PresetDefaults& d = defaults_for(preset);
  return {o.seq_len > 0 ? o.seq_len : d.seq_len, o.warmup >= 0 ? o.warmup : d.warmup,
          o.steps > 0 ? o.steps : d.steps};
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int64_t flops_per_token(const ModelConfig& c) {
  return 6 * c.num_parameters() + 12 * c.num_layers * c.max_seq_len * c.hidden_size;
}

}  // namespace agora::bench
