// DeMo against its specification (docs/algorithms.md section 1): the DCT test vectors,
// orthonormality and round trips, the top-k example, sign descent as the dense limit, the
// aggregation rule by hand, independence from arrival order, bad payloads left out, the
// look-ahead variant, state round trips, and a number-by-number comparison with an independent
// Python implementation (tests/parity/demo_parity_check.py) on payloads and updates.
#include "agora/optim/decoupled_momentum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

#include "../unit/test_support.h"
#include "agora/core/file.h"
#include "agora/optim/dct.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace {

// The specification's C^T for n = 4 (columns are basis vectors).
const double kDct4Transposed[4][4] = {{.5000, .6533, .5000, .2706},
                                      {.5000, .2706, -.5000, -.6533},
                                      {.5000, -.2706, -.5000, .6533},
                                      {.5000, -.6533, .5000, -.2706}};

std::vector<NamedParameter> make_params(const std::vector<std::vector<int64_t>>& shapes,
                                        uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    out.push_back({fmt::format("t{}", i), torch::randn(shapes[i]), true});
  }
  return out;
}

std::vector<NamedParameter> clone_params(const std::vector<NamedParameter>& params) {
  std::vector<NamedParameter> out;
  for (const auto& p : params) out.push_back({p.name, p.tensor.clone(), p.decay});
  return out;
}

void set_grads(std::vector<NamedParameter>& params, uint64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : params) p.tensor.mutable_grad() = torch::randn(p.tensor.sizes());
}

TEST(Dct, BasisMatchesTheSpecification) {
  const torch::Tensor c = dct_basis(4);
  for (int j = 0; j < 4; ++j) {
    for (int k = 0; k < 4; ++k) {
      EXPECT_NEAR(c[k][j].item<double>(), kDct4Transposed[j][k], 1e-4) << k << "," << j;
    }
  }
}

TEST(Dct, EncodesTheSpecificationVector) {
  const torch::Tensor x = torch::arange(8, torch::kFloat32);
  const torch::Tensor X = chunked_dct(x, chunk_geometry({8}, 64, 8)).flatten();
  const double expected[] = {9.8995, -6.4423, 0, -0.67345, 0, -0.2009, 0, -0.0507};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(X[i].item<double>(), expected[i], 1e-4) << i;
}

TEST(Dct, IsOrthonormal) {
  for (int64_t n : {1, 2, 3, 4, 7, 29, 48, 64}) {
    const torch::Tensor c = dct_basis(n).to(torch::kFloat64);
    EXPECT_TRUE(torch::allclose(c.matmul(c.t()), torch::eye(n, torch::kFloat64), 0, 1e-6)) << n;
  }
}

TEST(Dct, ChunkedRoundTripIsIdentity) {
  torch::manual_seed(3);
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {100}, {8}, {96, 40}, {64, 128}, {2, 12, 20}, {3, 2, 4, 6}}) {
    const torch::Tensor x = torch::randn(shape);
    const ChunkGeometry g = chunk_geometry(shape, 16, 4);
    const torch::Tensor X = chunked_dct(x, g);
    EXPECT_EQ(X.size(0), x.numel() / g.size());
    EXPECT_EQ(X.size(1), g.size());
    // Orthonormal: the energy is unchanged, and the inverse gives x back.
    EXPECT_NEAR(X.square().sum().item<double>(), x.square().sum().item<double>(), 1e-3);
    EXPECT_TRUE(torch::allclose(chunked_idct(X, x.sizes(), g), x, 1e-5, 1e-5));
  }
}

TEST(Dct, SparseInverseEqualsTheDenseOne) {
  torch::manual_seed(4);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{96}, {96, 40}, {2, 12, 20}}) {
    const ChunkGeometry g = chunk_geometry(shape, 16, 4);
    const int64_t chunks = c10::multiply_integers(shape) / g.size();
    // Five entries a chunk, positions may repeat (their values add up).
    const torch::Tensor positions = torch::randint(g.size(), {chunks, 5}, torch::kInt64);
    const torch::Tensor values = torch::randn({chunks, 5});
    const torch::Tensor dense = torch::zeros({chunks, g.size()}).scatter_add_(1, positions, values);
    EXPECT_TRUE(torch::allclose(sparse_chunked_idct(positions, values, shape, g),
                                chunked_idct(dense, shape, g), 1e-5, 1e-6));
  }
  EXPECT_TRUE(sparse_is_cheaper(4, {64, 64, 4}));
  EXPECT_FALSE(sparse_is_cheaper(128, {64, 64, 4}));
  EXPECT_TRUE(sparse_is_cheaper(32, {1, 64, 4}));
  EXPECT_FALSE(sparse_is_cheaper(64, {1, 64, 4}));
}

TEST(Dct, ChunksAreRowMajorBlocks) {
  // A [4, 6] tensor in 2 x 3 blocks: block (i, j) is chunk i * 2 + j, and its DC coefficient is
  // the block's sum divided by sqrt(6).
  const torch::Tensor x = torch::arange(24, torch::kFloat32).reshape({4, 6});
  const ChunkGeometry g{2, 3, 6};
  const torch::Tensor X = chunked_dct(x, g);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      const double block =
          x.slice(0, 2 * i, 2 * i + 2).slice(1, 3 * j, 3 * j + 3).sum().item<double>();
      EXPECT_NEAR(X[i * 2 + j][0].item<double>(), block / std::sqrt(6.0), 1e-4);
    }
  }
}

TEST(Demo, SelectsTheSpecificationTopK) {
  // beta = 0 and lr = 1 make delta the gradient; a gradient that is the inverse transform of the
  // chunk puts exactly those coefficients into the DCT.
  const torch::Tensor chunk = torch::tensor({0.1911f, 0.4076f, 0.1649f, 0.8059f});
  const ChunkGeometry g = chunk_geometry({4}, 64, 2);
  std::vector<NamedParameter> params = {{"w", torch::zeros({4}), false}};
  params[0].tensor.mutable_grad() = chunked_idct(chunk.reshape({1, 4}), {4}, g);
  DecoupledMomentum demo(params, {.beta = 0, .topk = 2, .chunk = 64});
  const Payload payload = decode_payload(demo.contribute({0, 1.0, 1}).bytes);
  EXPECT_EQ(payload.tensors[0].positions, (std::vector<uint32_t>{1, 3}));
  EXPECT_NEAR(payload.tensors[0].values[0], 0.4076, 1e-5);
  EXPECT_NEAR(payload.tensors[0].values[1], 0.8059, 1e-5);
}

TEST(Demo, FullTopKWithOnePeerIsSignDescent) {
  std::vector<NamedParameter> params = make_params({{32, 16}, {16}}, 1);
  const std::vector<NamedParameter> start = clone_params(params);
  DecoupledMomentum demo(params, {.beta = 0.9, .topk = 64 * 64, .chunk = 64});
  set_grads(params, 2);
  const double lr = 0.01;
  const Contribution own = demo.contribute({0, lr, 1});
  demo.apply({0, lr, 1}, std::span(&own, 1));
  for (size_t i = 0; i < params.size(); ++i) {
    // Everything is transmitted, so the momentum empties and the update is sign(lr * g).
    EXPECT_LT(demo.state().at("delta." + params[i].name).abs().max().item<double>(), 1e-6);
    const torch::Tensor expected = start[i].tensor - lr * params[i].tensor.grad().sign();
    EXPECT_TRUE(torch::allclose(params[i].tensor, expected, 0, 1e-7)) << params[i].name;
  }
}

TEST(Demo, AggregatesByTheMeanOfTheSelectors) {
  // Two peers, one chunk of 4: A selects {0, 2} = {1, 3}, B selects {2, 3} = {5, -2}; the
  // aggregate is [1, 0, (3 + 5) / 2, -2] = [1, 0, 4, -2].
  std::vector<NamedParameter> params = {{"w", torch::zeros({4}), false}};
  DecoupledMomentum demo(params, {.topk = 2, .chunk = 4});
  const auto payload = [](std::vector<uint32_t> positions, std::vector<float> values) {
    Payload p;
    p.tensors.push_back({demo_tensor_layout({4}, 4, 2, false), positions, values, {}, {}});
    return encode_payload(p);
  };
  const std::vector<Contribution> both = {{"a", payload({0, 2}, {1, 3})},
                                          {"b", payload({2, 3}, {5, -2})}};
  demo.apply({0, 0.5, 2}, both);
  const double aggregate[4] = {1, 0, 4, -2};
  for (int j = 0; j < 4; ++j) {
    double x = 0;  // (C^T aggregate)_j with the specification's matrix
    for (int k = 0; k < 4; ++k) x += kDct4Transposed[j][k] * aggregate[k];
    EXPECT_EQ(params[0].tensor[j].item<float>(), x > 0 ? -0.5f : 0.5f) << j << ": " << x;
  }
}

TEST(Demo, ResultDoesNotDependOnArrivalOrder) {
  const std::vector<std::vector<int64_t>> shapes = {{96, 40}, {100}, {2, 12, 20}};
  const std::vector<NamedParameter> initial = make_params(shapes, 5);
  std::vector<Contribution> contributions;
  for (int peer = 0; peer < 4; ++peer) {
    std::vector<NamedParameter> local = clone_params(initial);
    DecoupledMomentum demo(local, {.beta = 0.99, .topk = 8, .chunk = 16});
    set_grads(local, 100 + peer);
    contributions.push_back(demo.contribute({0, 0.01, 4}));
    contributions.back().peer = fmt::format("peer-{}", peer);
  }
  std::vector<torch::Tensor> reference;
  std::mt19937 rng(9);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(contributions.begin(), contributions.end(), rng);
    std::vector<NamedParameter> params = clone_params(initial);
    DecoupledMomentum demo(params, {.beta = 0.99, .topk = 8, .chunk = 16, .weight_decay = 0.1});
    demo.apply({0, 0.01, 4}, contributions);
    for (size_t i = 0; i < params.size(); ++i) {
      if (trial == 0) {
        reference.push_back(params[i].tensor);
      } else {
        EXPECT_TRUE(torch::equal(params[i].tensor, reference[i])) << "trial " << trial;
      }
    }
  }
}

TEST(Demo, LeavesBadContributionsOutAndSaysWhy) {
  std::vector<NamedParameter> params = make_params({{32, 16}}, 1);
  DecoupledMomentum demo(params, {.topk = 4, .chunk = 16});
  set_grads(params, 2);
  Contribution own = demo.contribute({3, 0.01, 2});
  own.peer = "honest";
  Contribution corrupt{"mallory", own.bytes};
  corrupt.bytes[corrupt.bytes.size() / 2] ^= 0x40;
  const Contribution truncated{"mallory", own.bytes.substr(0, own.bytes.size() - 1)};
  // A payload with another geometry (top-k 8) than the run's.
  std::vector<NamedParameter> other_params = clone_params(params);
  DecoupledMomentum other(other_params, {.topk = 8, .chunk = 16});
  set_grads(other_params, 2);
  const Contribution wrong_layout{"mallory", other.contribute({3, 0.01, 2}).bytes};
  const Contribution wrong_step{"mallory", demo.contribute({4, 0.01, 2}).bytes};
  const Contribution copy{"mallory", own.bytes};
  const std::pair<const Contribution*, const char*> cases[] = {
      {&truncated, "bytes"}, {&wrong_layout, "topk"}, {&wrong_step, "step 4"}, {&copy, "copy"}};
  for (const auto& [bad, reason] : cases) {
    const torch::Tensor before = params[0].tensor.clone();
    const ApplyReport report = demo.apply({3, 0.01, 2}, std::vector<Contribution>{own, *bad});
    ASSERT_EQ(report.refused.size(), 1u) << reason;
    EXPECT_EQ(report.refused[0].peer, "mallory");
    EXPECT_NE(report.refused[0].reason.find(reason), std::string::npos) << report.refused[0].reason;
    EXPECT_FALSE(torch::equal(params[0].tensor, before)) << "the honest contribution applies";
  }
  // A flipped bit is either left out or decodes to a well-formed payload; never a crash.
  const ApplyReport report = demo.apply({3, 0.01, 2}, std::vector<Contribution>{own, corrupt});
  for (const auto& r : report.refused) EXPECT_EQ(r.peer, "mallory");
}

// The first bad case applied on a fresh copy lands exactly where the honest contribution alone
// does: a left-out contribution has no effect at all, not even on the divisor of the mean.
TEST(Demo, ALeftOutContributionHasNoEffect) {
  std::vector<NamedParameter> a_params = make_params({{32, 16}}, 1);
  std::vector<NamedParameter> b_params = clone_params(a_params);
  DecoupledMomentum a(a_params, {.topk = 4, .chunk = 16});
  DecoupledMomentum b(b_params, {.topk = 4, .chunk = 16});
  set_grads(a_params, 2);
  Contribution own = a.contribute({3, 0.01, 2});
  own.peer = "honest";
  const Contribution wrong_step{"mallory", a.contribute({4, 0.01, 2}).bytes};
  a.apply({3, 0.01, 2}, std::vector<Contribution>{own, wrong_step});
  b.apply({3, 0.01, 1}, std::span(&own, 1));
  EXPECT_TRUE(torch::equal(a_params[0].tensor, b_params[0].tensor));
}

TEST(Demo, OneBitSendsSignsWithZeroAsPlus) {
  std::vector<NamedParameter> params = make_params({{64, 64}}, 1);
  DecoupledMomentum demo(params, {.topk = 4, .chunk = 64, .one_bit = true});
  set_grads(params, 2);
  const Payload payload = decode_payload(demo.contribute({0, 0.01, 1}).bytes);
  EXPECT_EQ(payload.tensors[0].layout.value_type, ValueType::kOneBit);
  for (float v : payload.tensors[0].values) EXPECT_TRUE(v == 1.0f || v == -1.0f);
  // 64 x 64 = 4096 coefficients: 4 positions as a 44-bit rank (6 bytes) and 4 bits per step.
  EXPECT_EQ(encoded_size(demo.payload_layout()), 20u + 4 + 4 * 2 + 1 + 12 + 6);
}

TEST(Demo, LookaheadEvaluatesAheadAndKeepsTheRecurrence) {
  const std::vector<NamedParameter> initial = make_params({{32, 16}, {16}}, 1);
  std::vector<NamedParameter> plain_params = clone_params(initial),
                              ahead_params = clone_params(initial);
  DecoupledMomentum plain(plain_params, {.topk = 4, .chunk = 16});
  DecoupledMomentum ahead(ahead_params, {.topk = 4, .chunk = 16, .lookahead = true});
  for (int64_t step = 0; step < 4; ++step) {
    const StepContext context{step, 0.01 * (step + 1), 1};
    const torch::Tensor before = ahead_params[0].tensor.clone();
    ahead.before_forward(context);
    if (step > 0) {
      const torch::Tensor moved = before - 0.01 * step * ahead.state().at("delta.t0").sign();
      EXPECT_TRUE(torch::allclose(ahead_params[0].tensor, moved, 0, 1e-7)) << step;
    }
    set_grads(plain_params, 10 + step);
    set_grads(ahead_params, 10 + step);
    const Contribution a = plain.contribute(context), b = ahead.contribute(context);
    EXPECT_TRUE(torch::equal(ahead_params[0].tensor, before)) << "the move is undone exactly";
    EXPECT_EQ(a.bytes, b.bytes) << "the same momentum, so the same payload, at step " << step;
    plain.apply(context, std::span(&a, 1));
    ahead.apply(context, std::span(&b, 1));
    for (size_t i = 0; i < initial.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain_params[i].tensor, ahead_params[i].tensor));
    }
  }
}

TEST(Demo, StateRoundTripContinuesIdentically) {
  const std::vector<NamedParameter> initial = make_params({{48, 32}, {40}}, 1);
  std::vector<NamedParameter> a_params = clone_params(initial);
  DecoupledMomentum a(a_params, {.topk = 4, .chunk = 16, .lookahead = true});
  for (int64_t step = 0; step < 2; ++step) {
    a.before_forward({step, 0.01, 1});
    set_grads(a_params, 20 + step);
    const Contribution c = a.contribute({step, 0.01, 1});
    a.apply({step, 0.01, 1}, std::span(&c, 1));
  }
  std::vector<NamedParameter> b_params = clone_params(a_params);
  DecoupledMomentum b(b_params, {.topk = 4, .chunk = 16, .lookahead = true});
  b.load_state(a.state());
  for (auto* run : {&a, &b}) {
    auto& params = run == &a ? a_params : b_params;
    run->before_forward({2, 0.01, 1});
    set_grads(params, 30);
    const Contribution c = run->contribute({2, 0.01, 1});
    run->apply({2, 0.01, 1}, std::span(&c, 1));
  }
  for (size_t i = 0; i < initial.size(); ++i) {
    EXPECT_TRUE(torch::equal(a_params[i].tensor, b_params[i].tensor));
  }
  std::map<std::string, torch::Tensor> missing = a.state();
  missing.erase("delta.t1");
  EXPECT_ERROR_WITH(b.load_state(missing), "t1");
}

TEST(Demo, WarnsAboutShapesThatWasteCompression) {
  std::vector<NamedParameter> params = {{"embed", torch::zeros({50257, 8}), true},
                                        {"ok", torch::zeros({128, 64}), true}};
  DecoupledMomentum demo(params, {.topk = 4, .chunk = 64});
  const std::vector<std::string> warnings = demo.warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("embed"), std::string::npos);
  EXPECT_NE(warnings[0].find("50257"), std::string::npos);
}

// The independent Python implementation checks a case written here: several peers, several
// steps, payloads and parameters after every step.
class DemoParity : public testing::TempDirTest, public ::testing::WithParamInterface<bool> {};

TEST_P(DemoParity, AgreesWithTheIndependentPythonImplementation) {
  const bool one_bit = GetParam();
  const std::vector<std::vector<int64_t>> shapes = {{96, 40}, {64, 128}, {100}, {2, 12, 20}, {37}};
  const int64_t peers = 3, steps = 4, topk = 4, chunk = 16;
  const double beta = 0.9, weight_decay = 0.1;
  const std::vector<double> lrs = {0.01, 0.02, 0.015, 0.005};
  const std::vector<NamedParameter> initial = make_params(shapes, 7);

  nlohmann::json tensors = nlohmann::json::array();
  std::vector<std::pair<std::string, torch::Tensor>> inputs, outputs;
  for (const auto& p : initial) {
    tensors.push_back({{"name", p.name}, {"shape", p.tensor.sizes().vec()}});
    inputs.emplace_back("param." + p.name, p.tensor);
  }
  std::vector<std::vector<NamedParameter>> params;
  std::vector<std::unique_ptr<DecoupledMomentum>> demos;
  const DemoOptions options{
      .beta = beta, .topk = topk, .chunk = chunk, .weight_decay = weight_decay, .one_bit = one_bit};
  for (int64_t i = 0; i < peers; ++i) {
    params.push_back(clone_params(initial));
    demos.push_back(std::make_unique<DecoupledMomentum>(params.back(), options));
  }
  for (int64_t step = 0; step < steps; ++step) {
    const StepContext context{step, lrs[step], peers};
    std::vector<Contribution> contributions;
    for (int64_t i = 0; i < peers; ++i) {
      set_grads(params[i], 1000 + step * 10 + i);
      for (const auto& p : params[i]) {
        inputs.emplace_back(fmt::format("grad.{}.{}.{}", step, i, p.name), p.tensor.grad().clone());
      }
      contributions.push_back(demos[i]->contribute(context));
      contributions.back().peer = fmt::format("peer-{:03}", i);
      write_file_atomic(dir_ / fmt::format("payload.{}.{}.agp", step, i),
                        contributions.back().bytes);
      for (const auto& [name, delta] : demos[i]->state()) {
        outputs.emplace_back(fmt::format("delta.{}.{}.{}", step, i, name.substr(6)), delta.clone());
      }
    }
    for (int64_t i = 0; i < peers; ++i) demos[i]->apply(context, contributions);
    for (const auto& p : params[0]) {
      outputs.emplace_back(fmt::format("param.{}.{}", step, p.name), p.tensor.clone());
    }
    for (int64_t i = 1; i < peers; ++i) {
      for (size_t k = 0; k < shapes.size(); ++k) {
        ASSERT_TRUE(torch::equal(params[i][k].tensor, params[0][k].tensor));
      }
    }
  }
  const nlohmann::json spec = {
      {"beta", beta},       {"topk", topk},   {"chunk", chunk}, {"weight_decay", weight_decay},
      {"one_bit", one_bit}, {"steps", steps}, {"peers", peers}, {"lr", lrs},
      {"max_norm_ratio", options.max_norm_ratio}, {"tensors", tensors}};
  write_file_atomic(dir_ / "case.json", spec.dump(2));
  save_tensors(dir_ / "inputs.safetensors", inputs, {});
  save_tensors(dir_ / "outputs.safetensors", outputs, {});
  const std::string command = fmt::format(
      "/usr/bin/python3 {}/tests/parity/demo_parity_check.py {}", AGORA_SOURCE_DIR, dir_.string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

INSTANTIATE_TEST_SUITE_P(ValuesAndSigns, DemoParity, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "OneBit" : "Float32"; });

}  // namespace
}  // namespace agora
