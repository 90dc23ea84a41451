// PeerNetwork fetching a state tensor by tensor: the parameters from their holders (a joiner),
// and an author's strategy state by its hash (a verifier), each tensor checked, and models of
// more tensors than a server keeps replies waiting for one connection.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "peer_network_fixture.h"

namespace agora::peer {
namespace {

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
  author.net->publish_strategy_state(hash, snapshot, 4);
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

}  // namespace
}  // namespace agora::peer
