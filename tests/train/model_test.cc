// The Llama model: shapes, parameter counts, causality, rotary and YaRN against their formulas,
// log-n scaling, the KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "agora/model/llama.h"
#include "agora/model/rotary.h"

namespace agora {
namespace {

ModelConfig tiny(int64_t vocab = 200, int64_t seq = 32) {
  ModelConfig c = model_preset("tiny", vocab, seq);
  return c;
}

int64_t count(Llama& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

TEST(Model, PresetParameterCounts) {
  // Closed-form counts for the demo vocabulary (8192): embedding (+ head when untied) + layers.
  EXPECT_EQ(model_preset("tiny", 8192, 64).num_parameters(),
            8192 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192 + 2 * 64) + 64);
  EXPECT_NEAR(model_preset("small", 8192, 256).num_parameters() / 1e6, 10.7, 0.2);
  EXPECT_NEAR(model_preset("gpt2-124m", 50257, 1024).num_parameters() / 1e6, 123.6, 1.0);
  EXPECT_NEAR(model_preset("1b", 50257, 2048).num_parameters() / 1e9, 1.08, 0.05);
  for (const char* name : {"tiny", "small"}) {
    torch::manual_seed(0);
    Llama model(model_preset(name, 8192, 64));
    EXPECT_EQ(count(model), model->config().num_parameters()) << name;
  }
}

TEST(Model, VocabularyIsPaddedToMultipleOf64) {
  Llama model(tiny(200));
  EXPECT_EQ(model->model->embed_tokens->weight.size(0), 256);
  const auto logits = model->forward(torch::randint(0, 200, {2, 7}, torch::kInt64));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 7, 256}));
}

TEST(Model, NamesFollowHuggingFaceLlama) {
  ModelConfig c = tiny();
  c.tie_embeddings = false;
  Llama model(c);
  const auto params = model->named_parameters();
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  // GQA: 2 kv heads of 16 dims.
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{32, 64}));
  Llama tied(tiny());
  EXPECT_FALSE(tied->named_parameters().contains("lm_head.weight"));
  EXPECT_TRUE(tied->lm_head_weight().is_same(tied->model->embed_tokens->weight));
}

TEST(Model, IsCausal) {
  torch::manual_seed(1);
  Llama model(tiny());
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = torch::randint(0, 200, {1, 16}, torch::kInt64);
  const torch::Tensor before = model->forward(tokens);
  tokens[0][10] = (tokens[0][10].item<int64_t>() + 1) % 200;
  const torch::Tensor after = model->forward(tokens);
  EXPECT_TRUE(torch::equal(before.narrow(1, 0, 10), after.narrow(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(before.narrow(1, 10, 6), after.narrow(1, 10, 6)));
}

TEST(Rotary, MatchesTheRotateHalfFormula) {
  ModelConfig c = tiny();  // head_dim 16
  const int64_t D = c.head_dim(), T = 9;
  const auto tables = rotary_tables(c, T, torch::kCPU);
  const torch::Tensor x = torch::randn({1, 1, T, D}, torch::kFloat64).to(torch::kFloat32);
  const torch::Tensor y = apply_rotary(x, tables.cos, tables.sin);
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double f = std::pow(c.rope_theta, -2.0 * i / D);
      const double a = x[0][0][p][i].item<double>(), b = x[0][0][p][i + D / 2].item<double>();
      EXPECT_NEAR(y[0][0][p][i].item<double>(), a * std::cos(p * f) - b * std::sin(p * f), 1e-5);
      EXPECT_NEAR(y[0][0][p][i + D / 2].item<double>(), b * std::cos(p * f) + a * std::sin(p * f),
                  1e-5);
    }
  }
}

TEST(Rotary, DotProductsDependOnlyOnRelativePosition) {
  ModelConfig c = tiny();
  const auto tables = rotary_tables(c, 20, torch::kCPU);
  const torch::Tensor q = torch::randn({1, 1, 1, c.head_dim()});
  const torch::Tensor k = torch::randn({1, 1, 1, c.head_dim()});
  const auto at = [&](const torch::Tensor& v, int64_t p) {
    return apply_rotary(v, tables.cos.narrow(0, p, 1), tables.sin.narrow(0, p, 1));
  };
  const double d1 = (at(q, 7) * at(k, 3)).sum().item<double>();
  const double d2 = (at(q, 15) * at(k, 11)).sum().item<double>();
  EXPECT_NEAR(d1, d2, 1e-4);
}

TEST(Rotary, YarnFollowsItsFormula) {
  ModelConfig c = tiny(200, 128);
  c.yarn_factor = 4.0;
  c.yarn_original_max_seq_len = 32;
  const int64_t D = c.head_dim();
  const RotaryFrequencies f = rotary_frequencies(c);
  EXPECT_DOUBLE_EQ(f.attention_factor, 0.1 * std::log(4.0) + 1.0);
  // Independent statement of docs/algorithms.md 5.3 / HF: a frequency's rotations over the original
  // context decide between keeping it (> beta_fast turns), dividing it by s (< beta_slow turns),
  // and a linear ramp over the dimension index between the two correction dimensions.
  const auto dim_for = [&](double rotations) {
    return D * std::log(32 / (rotations * 2 * std::numbers::pi)) / (2 * std::log(c.rope_theta));
  };
  const double low = std::max(0.0, std::floor(dim_for(32.0)));
  const double high = std::min(double(D - 1), std::ceil(dim_for(1.0)));
  for (int64_t i = 0; i < D / 2; ++i) {
    const double base = std::pow(c.rope_theta, -2.0 * i / D);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double expected = base / 4.0 * ramp + base * (1.0 - ramp);
    EXPECT_NEAR(f.inv_freq[i].item<double>(), expected, 1e-12) << "frequency " << i;
  }
  // cos and sin are scaled by the attention factor.
  const auto tables = rotary_tables(c, 5, torch::kCPU);
  EXPECT_NEAR(tables.cos[3][0].item<double>(),
              f.attention_factor * std::cos(3 * f.inv_freq[0].item<double>()), 1e-6);
}

TEST(Model, LognScalingIsOneAtTheTrainingLength) {
  torch::NoGradGuard no_grad;
  ModelConfig c = tiny(200, 16);
  c.num_layers = 1;  // with more layers, earlier positions' changes reach the last one
  torch::manual_seed(3);
  Llama plain(c);
  c.logn_attention_scaling = true;
  torch::manual_seed(3);
  Llama scaled(c);
  const torch::Tensor tokens = torch::randint(0, 200, {1, 16}, torch::kInt64);
  const torch::Tensor a = plain->forward(tokens), b = scaled->forward(tokens);
  // The last query attends n = 16 keys: factor log(16)/log(16) = 1. Position 0 attends one key,
  // so any factor gives the same softmax. Positions in between differ.
  EXPECT_TRUE(torch::allclose(a.select(1, 15), b.select(1, 15), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(a.select(1, 0), b.select(1, 0), 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(a.select(1, 5), b.select(1, 5), 1e-4, 1e-4));
}

// The factors themselves, against the formula written out: a query at position p (0-based)
// attends n = p + 1 keys and is scaled by log(n) / log(L), L the training length (YaRN's original
// length when YaRN stretches the context); a KV cache's later chunk continues the positions.
TEST(Model, LognScalingFactorsAreLogNOverLogTheTrainingLength) {
  ModelConfig c = tiny(200, 16);
  EXPECT_FALSE(logn_attention_scales(c, 0, 4, torch::kCPU).defined());  // off: no factors
  c.logn_attention_scaling = true;
  const torch::Tensor f = logn_attention_scales(c, 0, 16, torch::kCPU);
  ASSERT_EQ(f.numel(), 16);
  EXPECT_NEAR(f[5].item<double>(), std::log(6.0) / std::log(16.0), 1e-6);
  EXPECT_NEAR(f[0].item<double>(), 0.0, 1e-7);  // log 1
  EXPECT_NEAR(f[15].item<double>(), 1.0, 1e-6);
  const torch::Tensor later = logn_attention_scales(c, 20, 3, torch::kCPU);
  EXPECT_NEAR(later[1].item<double>(), std::log(22.0) / std::log(16.0), 1e-6);
  c.yarn_factor = 4.0;
  c.yarn_original_max_seq_len = 8;
  c.max_seq_len = 32;
  EXPECT_NEAR(logn_attention_scales(c, 0, 32, torch::kCPU)[30].item<double>(),
              std::log(31.0) / std::log(8.0), 1e-6);
}

TEST(Model, KvCacheMatchesFullForward) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  Llama model(tiny());
  const torch::Tensor tokens = torch::randint(0, 200, {2, 12}, torch::kInt64);
  const torch::Tensor full = model->forward(tokens);
  KvCache cache;
  const torch::Tensor head = model->forward(tokens.narrow(1, 0, 8), &cache);
  std::vector<torch::Tensor> parts{head};
  for (int64_t t = 8; t < 12; ++t) parts.push_back(model->forward(tokens.narrow(1, t, 1), &cache));
  EXPECT_EQ(cache.length, 12);
  EXPECT_TRUE(torch::allclose(torch::cat(parts, 1), full, 1e-5, 1e-5));
}

TEST(Model, RejectsBadShapes) {
  ModelConfig c = tiny();
  c.num_kv_heads = 3;
  EXPECT_THROW(Llama{c}, std::exception);
  Llama model(tiny(200, 8));
  EXPECT_THROW(model->forward(torch::zeros({1, 9}, torch::kInt64)), std::exception);
}

}  // namespace
}  // namespace agora
