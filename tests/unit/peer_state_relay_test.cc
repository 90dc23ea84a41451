// A joiner fetching the parameters from holders nobody can dial: chunk by chunk through a
// coordinator running the real TensorRelay (coord/tensor_relay.h), over real CURVE sockets;
// each tensor assembled and checked, a lying holder's tensor taken from the next holder.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "agora/coord/tensor_relay.h"
#include "agora/core/error.h"
#include "peer_network_fixture.h"

namespace agora::peer {
namespace {

double now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// The coordinator's side of the relay on a thread of its own: what service.cc does with
// GetTensor and TensorData, for members it knows by their transport keys.
class RelayingCoordinator {
 public:
  RelayingCoordinator(FakeCoordinator& c, const std::vector<Node*>& nodes) : c_(c) {
    for (Node* n : nodes) {
      key_of_curve_[n->id.curve_public()] = n->id.public_key();
      // The main connections, as the introductions' heartbeats found them.
      route_of_[n->id.public_key()] = c.routes.at(n->id.curve_public());
    }
    thread_ = std::thread([this] { run(); });
  }
  ~RelayingCoordinator() {
    stop_ = true;
    thread_.join();
  }
  uint64_t chunks() const { return chunks_.load(); }

 private:
  void run() {
    std::map<net::PublicKey, std::string>& route_of = route_of_;
    while (!stop_) {
      while (auto in = c_.server.recv()) {
        const net::PublicKey key = key_of_curve_.at(in->curve_key);
        std::vector<coord::RelayOutgoing> out;
        if (in->message.has_get_tensor()) {
          out = relay_.request(key, in->route, in->message.get_tensor(), true, true, now());
        } else if (in->message.has_tensor_data()) {
          out = relay_.answer(key, in->message.tensor_data(), now());
        } else {
          route_of[key] = in->route;
        }
        send(out, route_of);
      }
      send(relay_.pump(now()), route_of);
      chunks_ = relay_.counters().chunks;
      zmq::pollitem_t item{c_.server.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(5));
    }
  }
  void send(const std::vector<coord::RelayOutgoing>& out,
            const std::map<net::PublicKey, std::string>& route_of) {
    for (const auto& o : out) {
      if (!o.route.empty()) {
        c_.server.send(o.route, o.message);
      } else if (route_of.contains(o.member)) {
        c_.server.send(route_of.at(o.member), o.message);
      }
    }
  }

  FakeCoordinator& c_;
  std::map<std::string, net::PublicKey> key_of_curve_;
  std::map<net::PublicKey, std::string> route_of_;  // main connections, then from heartbeats
  coord::TensorRelay relay_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> chunks_{0};
  std::thread thread_;
};

wire::Member relayed(const Node& n) {
  wire::Member m = n.member();
  m.set_relayed(true);
  return m;
}

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>((i * 31 + static_cast<size_t>(seed)) % 251);
  return s;
}

TEST(PeerStateRelayTest, AJoinerAssemblesTensorsOfSeveralChunksFromHoldersNobodyCanDial) {
  FakeCoordinator coordinator;
  Node joiner(coordinator), a(coordinator), b(coordinator);
  introduce(coordinator, {&joiner, &a, &b});
  // Larger than two chunks, one small, one empty.
  auto snapshot = std::make_shared<Snapshot>();
  (*snapshot)["big"] =
      TensorBytes{"F32", {2, 4}, pattern(2 * net::kMaxRelayedChunkBytes + 1000, 1)};
  (*snapshot)["small"] = TensorBytes{"F32", {3}, pattern(12, 2)};
  (*snapshot)["empty"] = TensorBytes{"F32", {0}, ""};
  a.net->publish_snapshot(7, snapshot);
  b.net->publish_snapshot(7, snapshot);
  wire::StateRecord state;
  state.set_applied_steps(7);
  for (const auto& [name, t] : *snapshot) {
    state.add_tensor_names(name);
    state.add_tensor_hashes(blake2b256_bytes(t.data));
  }
  RelayingCoordinator relay(coordinator, {&joiner, &a, &b});
  const Snapshot got = joiner.net->fetch_state(state, {relayed(a), relayed(b)}, 60);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& [name, t] : *snapshot) {
    EXPECT_EQ(got.at(name).data, t.data) << name;
    EXPECT_EQ(got.at(name).shape, t.shape) << name;
  }
  EXPECT_EQ(relay.chunks(), 5u);  // 3 + 1 + 1
  const NetworkCounters fetched = joiner.net->counters();
  EXPECT_EQ(fetched.relay_chunks_fetched, 5u);
  EXPECT_EQ(a.net->counters().relay_chunks_served + b.net->counters().relay_chunks_served, 5u);
}

TEST(PeerStateRelayTest, ALyingHolderCostsItsTensorsARetryFromTheNextHolder) {
  FakeCoordinator coordinator;
  Node joiner(coordinator), liar(coordinator), honest(coordinator);
  introduce(coordinator, {&joiner, &liar, &honest});
  auto truth = std::make_shared<Snapshot>();
  (*truth)["w"] = TensorBytes{"F32", {4}, pattern(net::kMaxRelayedChunkBytes + 16, 3)};
  (*truth)["v"] = TensorBytes{"F32", {4}, pattern(16, 4)};
  auto lie = std::make_shared<Snapshot>(*truth);
  (*lie)["w"].data[net::kMaxRelayedChunkBytes + 3] ^= 1;  // one bit, in the second chunk
  (*lie)["v"].data.resize(20);                            // the wrong size
  liar.net->publish_snapshot(5, lie);
  honest.net->publish_snapshot(5, truth);
  wire::StateRecord state;
  state.set_applied_steps(5);
  for (const auto& [name, t] : *truth) {
    state.add_tensor_names(name);
    state.add_tensor_hashes(blake2b256_bytes(t.data));
  }
  RelayingCoordinator relay(coordinator, {&joiner, &liar, &honest});
  const Snapshot got = joiner.net->fetch_state(state, {relayed(liar), relayed(honest)}, 60);
  EXPECT_EQ(got.at("w").data, truth->at("w").data);
  EXPECT_EQ(got.at("v").data, truth->at("v").data);
  // With the liar alone, the fetch fails and says which tensor and why.
  try {
    joiner.net->fetch_state(state, {relayed(liar)}, 60);
    FAIL() << "a lying holder's state was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("majority's hash"), std::string::npos) << e.what();
  }
}

TEST(PeerStateRelayTest, AStateTheHolderNoLongerKeepsFailsWithoutWaitingOutTheTimeout) {
  FakeCoordinator coordinator;
  Node joiner(coordinator), holder(coordinator);
  introduce(coordinator, {&joiner, &holder});
  auto snapshot = std::make_shared<Snapshot>();
  (*snapshot)["w"] = TensorBytes{"F32", {1}, pattern(4, 5)};
  holder.net->publish_snapshot(3, snapshot);
  wire::StateRecord state;
  state.set_applied_steps(9);  // never published
  state.add_tensor_names("w");
  state.add_tensor_hashes(blake2b256_bytes(snapshot->at("w").data));
  RelayingCoordinator relay(coordinator, {&joiner, &holder});
  const auto started = Clock::now();
  EXPECT_THROW(joiner.net->fetch_state(state, {relayed(holder)}, 60), Error);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(), 20);
}

}  // namespace
}  // namespace agora::peer
