// PeerNetwork fetching a state tensor by tensor: the parameters from their holders (a joiner),
// and an author's strategy state by its hash (a verifier), each tensor checked, and models of
// more tensors than a server keeps replies waiting for one connection.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/peer/holder_spread.h"
#include "agora/peer/state_sample.h"
#include "peer_network_fixture.h"

namespace agora::peer {
namespace {

// ---- which holder is asked first (holder_spread.h) ------------------------------------------

TEST(HolderSpreadTest, EachTensorGoesToTheHolderWithTheFewestBytesSoFar) {
  // Loads after each: (100, 0) (100, 60) (100, 110) (140, 110) (140, 120) (140, 130).
  EXPECT_EQ(spread_over_holders({100, 60, 50, 40, 10, 10}, 2, 8),
            (std::vector<size_t>{0, 1, 1, 0, 1, 1}));
  // By count, the holder handed both embeddings would carry 2/3 of the bytes; by bytes each
  // carries one embedding and the small tensors even out.
  std::vector<uint64_t> model = {4'000'000, 4'000'000};
  for (int i = 0; i < 60; ++i) model.push_back(50'000);
  for (size_t holders : {2u, 3u, 4u}) {
    const std::vector<size_t> first = spread_over_holders(model, holders, 32);
    std::vector<uint64_t> load(holders);
    uint64_t total = 0;
    for (size_t i = 0; i < model.size(); ++i) {
      ASSERT_LT(first[i], holders);
      load[first[i]] += model[i];
      total += model[i];
    }
    EXPECT_NE(first[0], first[1]);
    // List scheduling in decreasing size ends within one tensor of the mean: no holder carries
    // more than total / holders plus the largest tensor.
    EXPECT_LE(*std::max_element(load.begin(), load.end()), total / holders + model[0])
        << holders << " holders";
  }
}

TEST(HolderSpreadTest, NoHolderIsFirstForMoreThanItsShareOfABatch) {
  // 100 equal tensors over 2 holders, 32 each at a time: each batch of 64 asks 32 of each, and
  // the last 36 ask 18 of each.
  std::vector<uint64_t> equal(100, 10);
  const std::vector<size_t> first = spread_over_holders(equal, 2, 32);
  for (size_t start = 0; start < first.size(); start += 64) {
    const size_t end = std::min(first.size(), start + 64);
    std::vector<size_t> asked(2);
    for (size_t i = start; i < end; ++i) ++asked[first[i]];
    EXPECT_LE(asked[0], 32u);
    EXPECT_LE(asked[1], 32u);
    EXPECT_EQ(asked[0], asked[1]) << "batch from " << start;
  }
  // One huge tensor first: the other holder still gets no more than 32 of the next 63.
  std::vector<uint64_t> skewed = {1'000'000};
  for (int i = 0; i < 63; ++i) skewed.push_back(1);
  const std::vector<size_t> second = spread_over_holders(skewed, 2, 32);
  EXPECT_EQ(std::count(second.begin(), second.end(), 1u), 32);
  EXPECT_THROW(spread_over_holders({1}, 0, 32), Error);
  EXPECT_THROW(spread_over_holders({1}, 2, 0), Error);
}

TEST(PeerStateFetchTest, FetchesAStateTensorByTensorAndChecksEachHash) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator), c(coordinator);
  introduce(coordinator, {&a, &b, &c});
  auto snapshot = std::make_shared<Snapshot>();
  (*snapshot)["w"] = TensorBytes{"F32", {2}, std::string(8, '\1')};
  (*snapshot)["b"] = TensorBytes{"F32", {1}, std::string(4, '\2')};
  b.net->publish_snapshot(10, snapshot);
  c.net->publish_snapshot(10, snapshot);
  wire::StateRecord state;
  state.set_applied_steps(10);
  for (const auto& [name, t] : *snapshot) {
    state.add_tensor_names(name);
    state.add_tensor_hashes(blake2b256_bytes(t.data));
  }
  const Snapshot got = a.net->fetch_state(state, {b.member(), c.member()}, 30);
  EXPECT_EQ(got.at("w").data, std::string(8, '\1'));
  EXPECT_EQ(got.at("w").shape, std::vector<int64_t>{2});
  EXPECT_EQ(got.at("b").data, std::string(4, '\2'));

  state.set_tensor_hashes(0, std::string(32, 'q'));  // the majority says otherwise
  EXPECT_THROW(a.net->fetch_state(state, {b.member(), c.member()}, 30), Error);
  state.set_applied_steps(20);  // nobody kept that step
  EXPECT_THROW(a.net->fetch_state(state, {b.member()}, 30), Error);
}

// More tensors than PeerServerLimits::replies_per_connection: a server drops requests beyond
// them, so asked at once, the rest waited out their timeout and the fetch failed.
constexpr int kManyTensors = 150;

std::shared_ptr<Snapshot> many_tensors() {
  auto snapshot = std::make_shared<Snapshot>();
  for (int i = 0; i < kManyTensors; ++i) {
    (*snapshot)[fmt::format("t{:03}", i)] =
        TensorBytes{"F32", {1}, std::string(4, static_cast<char>(i))};
  }
  return snapshot;
}

TEST(PeerStateFetchTest, AModelOfManyTensorsArrivesFromOneHolder) {
  FakeCoordinator coordinator;
  Node joiner(coordinator), holder(coordinator);
  introduce(coordinator, {&joiner, &holder});
  const auto snapshot = many_tensors();
  holder.net->publish_snapshot(4, snapshot);
  wire::StateRecord state;
  state.set_applied_steps(4);
  for (const auto& [name, t] : *snapshot) {
    state.add_tensor_names(name);
    state.add_tensor_hashes(blake2b256_bytes(t.data));
  }
  const Snapshot got = joiner.net->fetch_state(state, {holder.member()}, 20);
  ASSERT_EQ(got.size(), snapshot->size());
  for (const auto& [name, t] : *snapshot) EXPECT_EQ(got.at(name).data, t.data) << name;
}

TEST(PeerStateFetchTest, AStrategyStateOfManyTensorsArrivesFromItsAuthor) {
  FakeCoordinator coordinator;
  Node verifier(coordinator), author(coordinator);
  introduce(coordinator, {&verifier, &author});
  const auto snapshot = many_tensors();
  const std::string hash(32, 's');
  author.net->publish_strategy_state(
      std::make_shared<StrategyState>(StrategyState{hash, "", snapshot}), 4);
  std::vector<std::string> names;
  for (const auto& [name, t] : *snapshot) names.push_back(name);
  const Snapshot got =
      verifier.net->fetch_strategy_state(hash, names, author.member(), 20, nullptr);
  ASSERT_EQ(got.size(), snapshot->size());
  for (const auto& [name, t] : *snapshot) EXPECT_EQ(got.at(name).data, t.data) << name;
  // A state it does not hold is said so, tensor by tensor: not a timeout.
  EXPECT_THROW(
      verifier.net->fetch_strategy_state(std::string(32, 'x'), names, author.member(), 20, nullptr),
      StateNotServed);
}

// A verifier fetches a state's manifest under the state's hash (a blob: checked by its hash),
// then only the tensors it samples.
TEST(PeerStateFetchTest, AStrategyStatesManifestArrivesUnderTheStatesHash) {
  FakeCoordinator coordinator;
  Node verifier(coordinator), author(coordinator);
  introduce(coordinator, {&verifier, &author});
  const auto snapshot = many_tensors();
  auto state = std::make_shared<StrategyState>();
  for (const auto& [name, t] : *snapshot) state->manifest += blake2b256_bytes(t.data);
  state->hash = blake2b256_bytes(state->manifest);
  state->tensors = snapshot;
  author.net->publish_strategy_state(state, 4);
  EXPECT_EQ(verifier.net->fetch_strategy_manifest(state->hash, author.member(), 20, nullptr),
            state->manifest);
  const Snapshot got =
      verifier.net->fetch_strategy_state(state->hash, {"t007"}, author.member(), 20, nullptr);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at("t007").data, snapshot->at("t007").data);
  EXPECT_THROW(
      verifier.net->fetch_strategy_manifest(std::string(32, 'x'), author.member(), 20, nullptr),
      StateNotServed);

  // An author whose manifest does not hash to its commitment is not believed: the bytes are
  // refused like a payload's, and the fetch fails (not StateNotServed: it served something).
  auto liar = std::make_shared<StrategyState>(*state);
  liar->hash = std::string(32, 'L');
  author.net->publish_strategy_state(liar, 4);
  EXPECT_THROW(
      {
        try {
          verifier.net->fetch_strategy_manifest(liar->hash, author.member(), 3, nullptr);
        } catch (const StateNotServed&) {
          ADD_FAILURE() << "a manifest that does not hash to the state is not a refusal";
          throw Error("refusal");
        }
      },
      Error);
}

// Which tensors a check compares (state_sample.h): a share of the bytes, the same for every
// verifier of a check, different from check to check.
TEST(StateSampleTest, TakesTheShareOfBytesTheSampleRanksFirst) {
  std::vector<StateTensor> equal;
  for (int i = 0; i < 150; ++i) equal.push_back({fmt::format("delta.t{:03}", i), 400});
  EXPECT_EQ(sample_state("", equal, 0.1).size(), 150u);  // an old coordinator's check
  EXPECT_EQ(sample_state(std::string(32, 's'), equal, 1).size(), 150u);
  const std::string a = blake2b256_bytes("a"), b = blake2b256_bytes("b");
  const std::vector<size_t> first = sample_state(a, equal, 0.1);
  EXPECT_EQ(first.size(), 15u);  // 10% of equal tensors' bytes
  EXPECT_EQ(sample_state(a, equal, 0.1), first);
  EXPECT_NE(sample_state(b, equal, 0.1), first);
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end()));
  EXPECT_EQ(sample_state(a, equal, 1e-9).size(), 1u);  // never nothing

  // Over many checks each tensor is compared about as often as the fraction says: nobody can
  // count on one tensor being left out.
  std::vector<int> times(equal.size());
  for (int check = 0; check < 400; ++check) {
    for (size_t i : sample_state(blake2b256_bytes(fmt::format("{}", check)), equal, 0.1)) {
      ++times[i];
    }
  }
  for (size_t i = 0; i < times.size(); ++i) EXPECT_TRUE(times[i] > 15 && times[i] < 70) << i;

  // Unequal sizes: the bytes taken reach the share, and overshoot it by less than one tensor
  // (the draw stops at the first tensor that reaches it).
  std::vector<StateTensor> unequal;
  uint64_t total = 0;
  for (int i = 0; i < 40; ++i) {
    unequal.push_back({fmt::format("delta.u{:02}", i), static_cast<uint64_t>(100 + 97 * i)});
    total += unequal.back().bytes;
  }
  for (int check = 0; check < 50; ++check) {
    const std::vector<size_t> got =
        sample_state(blake2b256_bytes(fmt::format("u{}", check)), unequal, 0.25);
    uint64_t taken = 0;
    for (size_t i : got) taken += unequal[i].bytes;
    EXPECT_GE(taken, 0.25 * static_cast<double>(total));
    EXPECT_LT(taken, 0.25 * static_cast<double>(total) + unequal.back().bytes);
  }
}

}  // namespace
}  // namespace agora::peer
