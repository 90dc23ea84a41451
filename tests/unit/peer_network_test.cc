// PeerNetwork on loopback: fetching a step's payloads from their author or any other holder,
// verifying hash, signature and content, witnessing, and fetching a model state tensor by
// tensor. A plain CURVE server stands in for the coordinator.
#include "agora/peer/peer_network.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/hash.h"

namespace agora::peer {
namespace {

using Clock = std::chrono::steady_clock;

// A coordinator that only listens: it collects what peers send it.
struct FakeCoordinator {
  net::Identity id = net::Identity::generate();
  net::Context context;
  net::Server server{context, id, "tcp://127.0.0.1:*", {}};

  // The next message of kind `kind` within `seconds`.
  std::optional<wire::Envelope> wait_for(wire::Envelope::BodyCase kind, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      while (auto in = server.recv()) {
        if (in->message.body_case() == kind) return in->message;
      }
      zmq::pollitem_t item{server.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }
};

struct Node {
  net::Identity id = net::Identity::generate();
  std::unique_ptr<PeerNetwork> net;
  Node(FakeCoordinator& c, PayloadValidator validator = {}) {
    PeerNetworkOptions o;
    o.coordinator = c.server.bound_endpoint();
    o.coordinator_key = c.id.public_key();
    o.listen = "tcp://127.0.0.1:*";
    o.blob_timeout_seconds = 2;
    net = std::make_unique<PeerNetwork>(id, o);
    net->configure("run", std::move(validator));
  }
  wire::Member member() const {
    wire::Member m;
    m.set_key(id.public_key());
    m.set_endpoint(net->endpoint());
    return m;
  }
  // Stores `bytes` as its payload for `step` and returns the signed commitment.
  wire::CommitRecord commit(uint64_t step, const std::string& bytes) {
    const std::string hash = blake2b256_bytes(bytes);
    net->blobs().put(hash, bytes, step);
    wire::CommitRecord r;
    r.set_author(id.public_key());
    r.set_step(step);
    r.set_payload_hash(hash);
    r.set_signature(id.sign(net::commit_signing_bytes("run", step, hash)));
    return r;
  }
};

TEST(PeerNetworkTest, FetchesFromTheAuthorAndWitnesses) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator);
  const wire::CommitRecord record = b.commit(3, "payload of b");
  a.net->collect(3, {record}, {a.member(), b.member()}, /*witness=*/true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().step(), 3u);
  ASSERT_EQ(witness->witness().held_size(), 1);
  EXPECT_EQ(witness->witness().held(0), record.payload_hash());
  EXPECT_EQ(a.net->blobs().get(record.payload_hash()), "payload of b");
}

TEST(PeerNetworkTest, WrongBytesFromOneHolderSendToTheNext) {
  FakeCoordinator coordinator;
  Node a(coordinator), liar(coordinator), relay(coordinator), author(coordinator);
  const wire::CommitRecord record = author.commit(1, "the real payload");
  // The author is gone (not listed); the first holder asked serves other bytes under the hash.
  liar.net->blobs().put(record.payload_hash(), "forged bytes", 1);
  relay.net->blobs().put(record.payload_hash(), "the real payload", 1);
  const auto missing =
      a.net->ensure(1, {record}, {liar.member(), relay.member()}, /*timeout_seconds=*/20);
  EXPECT_TRUE(missing.empty());
  EXPECT_EQ(a.net->blobs().get(record.payload_hash()), "the real payload");
  EXPECT_GE(a.net->counters().payloads_rejected, 1u);
}

TEST(PeerNetworkTest, BadSignatureOrContentIsRejectedWithAReason) {
  FakeCoordinator coordinator;
  Node a(coordinator, [](std::string_view bytes) -> std::optional<std::string> {
    if (bytes.starts_with("ok")) return std::nullopt;
    return "not a payload of this model";
  });
  Node b(coordinator);
  const wire::CommitRecord bad_content = b.commit(2, "garbage");
  wire::CommitRecord forged = b.commit(2, "ok but unsigned");
  forged.set_signature(std::string(64, 'x'));
  const wire::CommitRecord good = b.commit(2, "ok fine");
  a.net->collect(2, {bad_content, forged, good}, {b.member()}, /*witness=*/true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  ASSERT_EQ(witness->witness().held_size(), 1);
  EXPECT_EQ(witness->witness().held(0), good.payload_hash());
  ASSERT_EQ(witness->witness().rejected_size(), 2);
  std::string reasons;
  for (const auto& r : witness->witness().rejected()) reasons += r.reason() + "|";
  EXPECT_NE(reasons.find("not a payload of this model"), std::string::npos) << reasons;
  EXPECT_NE(reasons.find("signature"), std::string::npos) << reasons;
  EXPECT_FALSE(a.net->blobs().contains(bad_content.payload_hash()));
}

TEST(PeerNetworkTest, NobodyHoldingItEndsTheFetch) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator);
  wire::CommitRecord record = b.commit(5, "x");
  record.set_payload_hash(std::string(32, 'z'));  // a hash b does not hold
  const auto missing = a.net->ensure(5, {record}, {b.member()}, 20);
  ASSERT_EQ(missing.size(), 1u);
}

TEST(PeerNetworkTest, FetchesAStateTensorByTensorAndChecksEachHash) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator), c(coordinator);
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

}  // namespace
}  // namespace agora::peer
