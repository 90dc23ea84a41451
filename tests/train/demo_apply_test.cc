// DeMo's apply() at many peers. The aggregation (demo_aggregate.h) against the rule it replaced:
// scatter-adding one payload after another into float32 zeros, in the given order, then dividing
// by max(count, 1) (dense) or each value by its position's count (sparse); the results must be
// equal bit for bit, and the same with 1, 2 and 4 threads. Decoding once (decoded_payloads.h):
// payloads decoded before apply() give the same parameters as bytes decoded by apply(), the
// store hands out only what was decoded from the bytes named by its hash, and a strategy made
// after the store (a joiner's) takes from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/optim/chunking.h"
#include "agora/optim/decoded_payloads.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/optim/demo_aggregate.h"

namespace agora {
namespace {

// P payloads of one tensor, positions drawn from a few "popular" ones so that coefficients are
// often selected by many payloads (the sums then depend on their order), values of mixed scale.
std::vector<Payload> make_payloads(const std::vector<int64_t>& shape, int64_t topk, int64_t peers,
                                   uint64_t seed) {
  const TensorLayout layout = demo_tensor_layout(shape, 64, topk, false);
  std::mt19937_64 random(seed);
  std::vector<Payload> out(static_cast<size_t>(peers));
  for (Payload& payload : out) {
    TensorPayload entry;
    entry.layout = layout;
    const int64_t size = layout.chunk_size(), k = layout.topk;
    std::vector<uint32_t> all(static_cast<size_t>(std::min<int64_t>(size, 2 * k)));
    for (int64_t c = 0; c < layout.num_chunks(); ++c) {
      for (size_t x = 0; x < all.size(); ++x)
        all[x] = static_cast<uint32_t>(x * (size / all.size()));
      std::shuffle(all.begin(), all.end(), random);
      std::sort(all.begin(), all.begin() + k);
      entry.positions.insert(entry.positions.end(), all.begin(), all.begin() + k);
    }
    std::lognormal_distribution<float> magnitude(0.0f, 3.0f);
    for (size_t i = 0; i < entry.positions.size(); ++i) {
      entry.values.push_back(magnitude(random) * (random() & 1 ? 1.0f : -1.0f));
    }
    payload.tensors.push_back(std::move(entry));
  }
  return out;
}

// The rule before demo_aggregate.cc: one scatter per payload. Returns the sum and the count.
std::pair<torch::Tensor, torch::Tensor> scattered(const std::vector<Payload>& payloads,
                                                  const TensorLayout& layout) {
  const int64_t chunks = layout.num_chunks(), k = layout.topk;
  torch::Tensor sum = torch::zeros({chunks, layout.chunk_size()});
  torch::Tensor count = torch::zeros({chunks, layout.chunk_size()});
  for (const Payload& payload : payloads) {
    const TensorPayload& entry = payload.tensors[0];
    const torch::Tensor index =
        torch::tensor(std::vector<int64_t>(entry.positions.begin(), entry.positions.end()))
            .reshape({chunks, k});
    const torch::Tensor values = torch::tensor(entry.values).reshape({chunks, k});
    sum.scatter_add_(1, index, values);
    count.scatter_add_(1, index, torch::ones({chunks, k}));
  }
  return {sum, count};
}

class DemoAggregate : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    at::set_num_threads(GetParam());
  }
  void TearDown() override { at::set_num_threads(threads_); }
  int threads_ = 1;
};

TEST_P(DemoAggregate, DenseMeanEqualsScatteringOnePayloadAtATime) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{512, 256}, {4, 128, 192}, {4096}}) {
    for (const int64_t peers : {1, 2, 5, 40}) {
      const std::vector<Payload> payloads = make_payloads(shape, 32, peers, 7 + peers);
      const TensorLayout& layout = payloads[0].tensors[0].layout;
      auto [sum, count] = scattered(payloads, layout);
      const torch::Tensor expected = sum.div_(count.clamp_min_(1));
      EXPECT_TRUE(torch::equal(mean_coefficients(payloads, 0, layout), expected))
          << c10::str(torch::IntArrayRef(shape)) << ", " << peers << " peers";
    }
  }
}

TEST_P(DemoAggregate, WeightsEqualEachValueOverItsCount) {
  for (const int64_t peers : {1, 3}) {
    const std::vector<Payload> payloads = make_payloads({256, 128}, 4, peers, 11 + peers);
    const TensorLayout& layout = payloads[0].tensors[0].layout;
    const auto [sum, count] = scattered(payloads, layout);
    std::vector<torch::Tensor> index, value;
    for (const Payload& payload : payloads) {
      const TensorPayload& entry = payload.tensors[0];
      index.push_back(
          torch::tensor(std::vector<int64_t>(entry.positions.begin(), entry.positions.end()))
              .reshape({layout.num_chunks(), layout.topk}));
      value.push_back(torch::tensor(entry.values).reshape({layout.num_chunks(), layout.topk}));
    }
    const torch::Tensor positions = torch::cat(index, 1);
    const torch::Tensor weights = torch::cat(value, 1).div_(count.gather(1, positions));
    const WeightedSelections got = weighted_selections(payloads, 0, layout);
    EXPECT_TRUE(torch::equal(got.positions, positions)) << peers << " peers";
    EXPECT_TRUE(torch::equal(got.weights, weights)) << peers << " peers";
  }
}

TEST_P(DemoAggregate, RefusesEntriesOfTheWrongSize) {
  std::vector<Payload> payloads = make_payloads({128, 64}, 8, 2, 3);
  const TensorLayout layout = payloads[0].tensors[0].layout;
  payloads[1].tensors[0].values.pop_back();
  EXPECT_THROW(mean_coefficients(payloads, 0, layout), Error);
  EXPECT_THROW(weighted_selections(payloads, 0, layout), Error);
}

INSTANTIATE_TEST_SUITE_P(Threads, DemoAggregate, ::testing::Values(1, 2, 4));

std::vector<NamedParameter> random_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"w", torch::randn({128, 64}), true}, {"b", torch::randn({64}), false}};
}

std::vector<NamedParameter> clones(const std::vector<NamedParameter>& params) {
  std::vector<NamedParameter> out;
  for (const NamedParameter& p : params) out.push_back({p.name, p.tensor.clone(), p.decay});
  return out;
}

TEST(DecodeOnce, PayloadsDecodedBeforeApplyGiveTheSameParameters) {
  const DemoOptions options{.topk = 8, .chunk = 32, .weight_decay = 0.1};
  const std::vector<NamedParameter> start = random_params(1);
  std::vector<Contribution> contributions;
  for (int peer = 0; peer < 6; ++peer) {
    std::vector<NamedParameter> local = clones(start);
    DecoupledMomentum demo(local, options);
    torch::manual_seed(10 + peer);
    for (NamedParameter& p : local) p.tensor.mutable_grad() = torch::randn(p.tensor.sizes());
    contributions.push_back(demo.contribute({3, 0.01, 6}));
    contributions.back().peer = fmt::format("peer-{}", peer);
  }
  contributions.push_back(contributions[0]);  // a copy, left out either way
  contributions.back().peer = "peer-9";
  contributions.push_back({"peer-8", "not a payload"});
  for (Contribution& c : contributions) c.hash = blake2b256_bytes(c.bytes);

  std::vector<NamedParameter> plain = clones(start), early = clones(start);
  DecoupledMomentum plain_demo(plain, options), early_demo(early, options);
  // The store outlives the strategy that was made with it, as a peer's does: a strategy made
  // later (a joiner's, after it loaded the state) is handed it and takes from it.
  auto store = std::make_shared<DecodedPayloads>(early_demo.payload_layout(), size_t{1} << 24);
  {
    std::vector<NamedParameter> discarded = clones(start);
    DecoupledMomentum before_sync(discarded, options);
    before_sync.share_decoded_payloads(store);
  }
  early_demo.share_decoded_payloads(store);
  for (const Contribution& c : contributions) {
    try {
      store->decode(c.hash, c.bytes, 3);
    } catch (const Error&) {
    }
  }
  EXPECT_EQ(store->size(), 6u) << "the copy is kept once, junk never";
  const ApplyReport a = plain_demo.apply({3, 0.01, 8}, contributions);
  const ApplyReport b = early_demo.apply({3, 0.01, 8}, contributions);
  EXPECT_EQ(store->size(), 0u) << "apply() took them all";
  EXPECT_EQ(a.predecoded, 0);
  EXPECT_EQ(b.predecoded, 6);
  ASSERT_EQ(a.refused.size(), 2u);
  ASSERT_EQ(b.refused.size(), 2u);
  for (size_t i = 0; i < a.refused.size(); ++i) {
    EXPECT_EQ(a.refused[i].peer, b.refused[i].peer);
    EXPECT_EQ(a.refused[i].reason, b.refused[i].reason);
  }
  EXPECT_EQ(a.clipped, b.clipped);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i].tensor, early[i].tensor)) << plain[i].name;
  }
}

TEST(DecodeOnce, HandsOutOnlyWhatTheSameBytesDecodedTo) {
  std::vector<NamedParameter> params = random_params(2);
  DecoupledMomentum demo(params, {.topk = 4, .chunk = 32});
  for (NamedParameter& p : params) p.tensor.mutable_grad() = torch::randn(p.tensor.sizes());
  const std::string bytes = demo.contribute({5, 0.01, 1}).bytes;
  const std::string hash = blake2b256_bytes(bytes);
  DecodedPayloads store(demo.payload_layout(), size_t{1} << 20);
  EXPECT_EQ(store.decode(hash, bytes, 4), 5u) << "another step: reported, not kept";
  EXPECT_EQ(store.size(), 0u);
  EXPECT_THROW(store.decode(blake2b256_bytes(bytes.substr(1)), bytes.substr(1), 5), Error);
  EXPECT_EQ(store.decode(hash, bytes, 5), 5u);
  std::string other = bytes;
  other.back() ^= 1;
  EXPECT_FALSE(store.take(blake2b256_bytes(other), other).has_value());
  EXPECT_FALSE(store.take(hash, bytes.substr(1)).has_value()) << "not the bytes hashed";
  const std::optional<Payload> taken = store.take(hash, bytes);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken, decode_payload(bytes, demo.payload_layout()));
  EXPECT_FALSE(store.take(hash, bytes).has_value()) << "taken once";

  store.decode(hash, bytes, 5);
  store.forget_through(4);
  EXPECT_EQ(store.size(), 1u);
  store.forget_through(5);
  EXPECT_EQ(store.size(), 0u);

  DecodedPayloads tiny(demo.payload_layout(), 64);
  tiny.decode(hash, bytes, 5);
  EXPECT_EQ(tiny.size(), 0u) << "larger than the whole budget: not kept";

  // A store made for another layout is refused, not filled with payloads apply() cannot take.
  std::vector<NamedParameter> others = random_params(3);
  DecoupledMomentum other_demo(others, {.topk = 4, .chunk = 16});
  EXPECT_THROW(demo.share_decoded_payloads(
                   std::make_shared<DecodedPayloads>(other_demo.payload_layout(), size_t{1} << 20)),
               Error);
}

}  // namespace
}  // namespace agora
