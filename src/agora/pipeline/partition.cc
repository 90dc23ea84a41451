#include "agora/pipeline/partition.h"

#include <fmt/format.h>

#include <limits>
#include <string>
#include <utility>

#include "agora/core/error.h"

namespace agora {

int64_t layer_parameters(const ModelConfig& m) {
  const int64_t d = m.hidden_size, kv = m.num_kv_heads * m.head_dim();
  const int64_t attention = d * d + 2 * d * kv + d * d;  // q, k, v, o
  const int64_t mlp = 3 * d * m.intermediate_size;       // gate, up, down
  return 2 * d + attention + mlp;                        // + two RMSNorm gains
}

int64_t embedding_parameters(const ModelConfig& m) {
  return m.padded_vocab_size() * m.hidden_size;
}

int64_t head_parameters(const ModelConfig& m) {
  return m.hidden_size + m.padded_vocab_size() * m.hidden_size;
}

std::vector<StageSpan> partition_model(const ModelConfig& model, int64_t stages) {
  const int64_t L = model.num_layers;
  if (stages < 1 || stages > L) {
    fail("pipeline.stages = {} is invalid for a model of {} layers (allowed: 1 to {})", stages, L,
         L);
  }
  if (model.tie_embeddings && stages > 1) {
    fail("a pipeline of {} stages needs untied embeddings (model.tie_embeddings = false)", stages);
  }
  const int64_t layer = layer_parameters(model);
  auto cost = [&](int64_t stage, int64_t first, int64_t end) {
    int64_t c = (end - first) * layer;
    if (stage == 0) c += embedding_parameters(model);
    if (stage == stages - 1) c += head_parameters(model);
    return c;
  };
  // best[s][l]: for stages 0..s-1 covering layers [0, l), the smallest (largest stage, sum of
  // squared stage sizes), compared in that order: the largest stage first, then the most even
  // spread of the rest. cut[s][l]: the first layer of stage s-1 in that cut. O(S L^2) over at
  // most a few hundred layers.
  using Cost = std::pair<int64_t, double>;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<Cost>> best(stages + 1, std::vector<Cost>(L + 1, Cost{kNone, 0.0}));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = {0, 0.0};
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t end = s; end <= L; ++end) {
      for (int64_t first = s - 1; first < end; ++first) {
        const Cost& before = best[s - 1][first];
        if (before.first == kNone) continue;
        const int64_t c = cost(s - 1, first, end);
        const Cost candidate{std::max(before.first, c),
                             before.second + static_cast<double>(c) * static_cast<double>(c)};
        if (candidate < best[s][end]) {
          best[s][end] = candidate;
          cut[s][end] = first;
        }
      }
    }
  }
  std::vector<StageSpan> spans(stages);
  for (int64_t s = stages, end = L; s >= 1; --s) {
    StageSpan& span = spans[s - 1];
    span.stage = s - 1;
    span.first_layer = cut[s][end];
    span.end_layer = end;
    span.embedding = s - 1 == 0;
    span.head = s == stages;
    span.parameters = cost(s - 1, span.first_layer, end);
    end = span.first_layer;
  }
  return spans;
}

std::string describe(const std::vector<StageSpan>& spans) {
  std::string out;
  for (const StageSpan& span : spans) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}:[{}{}-{}{}]", span.stage, span.embedding ? "emb " : "", span.first_layer,
                       span.end_layer - 1, span.head ? " head" : "");
  }
  return out;
}

std::vector<ParameterShape> stage_parameter_shapes(const ModelConfig& model,
                                                   const StageSpan& span) {
  std::vector<ParameterShape> out;
  for (ParameterShape& p : parameter_shapes(model)) {
    bool holds = false;
    if (p.name.rfind("model.layers.", 0) == 0) {
      const int64_t layer = std::stoll(p.name.substr(13, p.name.find('.', 13) - 13));
      holds = layer >= span.first_layer && layer < span.end_layer;
    } else if (p.name == "model.embed_tokens.weight") {
      holds = span.embedding;
    } else {
      holds = span.head;  // model.norm.weight, lm_head.weight
    }
    if (holds) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace agora
