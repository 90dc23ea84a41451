#include "bench_options.h"

#include <cmath>
#include <regex>

#include "agora/core/error.h"

namespace agora::bench {

namespace {

const PresetDefaults& defaults_for(const std::string& name) {
  for (const PresetDefaults& d : kPresetDefaults) {
    if (name == d.name) return d;
  }
  model_preset(name, 8192, 64);  // throws the list of presets for an unknown name
  fail("bench_trainer has no defaults for preset '{}'", name);
}

}  // namespace

std::string Case::name() const {
  return preset + ":" + std::to_string(batch) + "x" + std::to_string(seq_len) + "/" +
         std::to_string(micro_batch);
}

Case parse_case(const std::string& text, int64_t warmup, int64_t steps) {
  static const std::regex form(R"(([A-Za-z0-9_.-]+):([0-9]{1,6})x([0-9]{1,6})/([0-9]{1,6}))");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    fail("case '{}' is not of the form preset:BATCHxSEQ_LEN/MICRO_BATCH (e.g. tiny:32x128/8)",
         text);
  }
  Case c;
  c.preset = m[1];
  c.batch = std::stoll(m[2]);
  c.seq_len = std::stoll(m[3]);
  c.micro_batch = std::stoll(m[4]);
  if (c.batch < 1 || c.seq_len < 1 || c.micro_batch < 1 || c.batch % c.micro_batch != 0) {
    fail("case '{}': batch, sequence length and micro-batch must be >= 1 and the micro-batch "
         "must divide the batch",
         text);
  }
  const PresetDefaults& d = defaults_for(c.preset);
  const double scale = static_cast<double>(d.tokens_per_step) / c.tokens_per_step();
  c.warmup = warmup >= 0 ? warmup
                         : std::max<int64_t>(1, std::llround(static_cast<double>(d.warmup) * scale));
  c.steps = steps > 0 ? steps
                      : std::max<int64_t>(2, std::llround(static_cast<double>(d.steps) * scale));
  return c;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int64_t flops_per_token(const ModelConfig& c) {
  // An untied input embedding is a lookup, not a matrix product: it does no multiply-adds, so
  // counting it (as 6 N does) would credit the small preset with 20% more work than it does.
  const int64_t lookup = c.tie_embeddings ? 0 : c.padded_vocab_size() * c.hidden_size;
  return 6 * (c.num_parameters() - lookup) + 12 * c.num_layers * c.max_seq_len * c.hidden_size;
}

}  // namespace agora::bench
