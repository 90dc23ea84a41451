// The loopback set-up PeerNetwork's tests share: a plain CURVE server standing in for the
// coordinator, and nodes (a PeerNetwork each) that it introduces to one another as a RoundStart
// does.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agora/core/hash.h"
#include "agora/peer/peer_network.h"

namespace agora::peer {
namespace {

using Clock = std::chrono::steady_clock;

// A coordinator that listens, and tells peers the run's members as a RoundStart does.
struct FakeCoordinator {
  net::Identity id = net::Identity::generate();
  net::Context context;
  net::Server server{context, id, "tcp://127.0.0.1:*", {}};
  std::map<std::string, std::string> routes;   // curve key -> route, learnt from heartbeats
  std::map<std::string, uint64_t> heartbeats;  // by curve key
  std::deque<wire::Envelope> received;

  void pump(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    do {
      while (auto in = server.recv()) {
        routes[in->curve_key] = in->route;
        if (in->message.has_heartbeat()) {
          ++heartbeats[in->curve_key];
        } else {
          received.push_back(std::move(in->message));
        }
      }
      zmq::pollitem_t item{server.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
    } while (Clock::now() < end);
  }

  // The next message of kind `kind` within `seconds`.
  std::optional<wire::Envelope> wait_for(wire::Envelope::BodyCase kind, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (true) {
      for (auto it = received.begin(); it != received.end(); ++it) {
        if (it->body_case() == kind) {
          wire::Envelope m = std::move(*it);
          received.erase(it);
          return m;
        }
      }
      if (Clock::now() >= end) return std::nullopt;
      pump(0.02);
    }
  }
};

struct Node {
  net::Identity id = net::Identity::generate();
  std::unique_ptr<PeerNetwork> net;
  Node(FakeCoordinator& c, PayloadValidator validator = {}, double witness_seconds = 10,
       double blob_timeout_seconds = 2, uint64_t max_payload_bytes = 0, double grace_seconds = 60) {
    PeerNetworkOptions o;
    o.coordinator = c.server.bound_endpoint();
    o.coordinator_key = c.id.public_key();
    o.listen = "tcp://127.0.0.1:*";
    o.blob_timeout_seconds = blob_timeout_seconds;
    o.server.grace_seconds = grace_seconds;
    net = std::make_unique<PeerNetwork>(id, o);
    LinkSettings settings;
    settings.run_id = "run";
    settings.validator = std::move(validator);
    settings.witness_seconds = witness_seconds;
    settings.max_payload_bytes = max_payload_bytes;
    net->configure(std::move(settings));
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
    return sign(step, hash);
  }
  wire::CommitRecord sign(uint64_t step, const std::string& hash) const {
    wire::CommitRecord r;
    r.set_author(id.public_key());
    r.set_step(step);
    r.set_payload_hash(hash);
    r.set_signature(id.sign(net::commit_signing_bytes("run", step, hash)));
    return r;
  }
};

// Sends every node a RoundStart naming `members` (peers' servers answer members only) and waits
// until each has taken it in.
void introduce(FakeCoordinator& c, const std::vector<Node*>& nodes,
               const std::vector<wire::Member>& members) {
  wire::Envelope start;
  for (const auto& m : members) *start.mutable_round_start()->add_members() = m;
  for (Node* node : nodes) {
    const std::string curve = node->id.curve_public();
    for (int i = 0; i < 500 && !c.routes.count(curve); ++i) c.pump(0.01);
    ASSERT_TRUE(c.routes.count(curve)) << "no heartbeat from a node";
    c.server.send(c.routes.at(curve), start);
    ASSERT_TRUE(node->net->next_from_coordinator(10).has_value());
  }
}

void introduce(FakeCoordinator& c, const std::vector<Node*>& nodes) {
  std::vector<wire::Member> members;
  for (Node* node : nodes) members.push_back(node->member());
  introduce(c, nodes, members);
}

}  // namespace
}  // namespace agora::peer
