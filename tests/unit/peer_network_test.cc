// PeerNetwork on loopback: fetching a step's payloads from their author or any other holder,
// verifying hash, signature and content, witnessing, and what its server refuses. A plain CURVE
// server stands in for the coordinator (peer_network_fixture.h); fetching states is in
// peer_state_fetch_test.cc.
#include "agora/peer/peer_network.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "peer_network_fixture.h"

namespace agora::peer {
namespace {

TEST(PeerNetworkTest, FetchesFromTheAuthorAndWitnesses) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator);
  introduce(coordinator, {&a, &b});
  const wire::CommitRecord record = b.commit(3, "payload of b");
  a.net->collect(3, {record}, {a.member(), b.member()}, /*witness=*/true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().step(), 3u);
  EXPECT_EQ(witness->witness().held_size(), 0);
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\x01'));  // commit 0 held
  EXPECT_EQ(a.net->blobs().get(record.payload_hash()), "payload of b");
}

TEST(PeerNetworkTest, WrongBytesFromOneHolderSendToTheNext) {
  FakeCoordinator coordinator;
  Node a(coordinator), liar(coordinator), relay(coordinator), author(coordinator);
  introduce(coordinator, {&a, &liar, &relay, &author});
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
  Node a(coordinator,
         [](std::string_view, std::string_view bytes, uint64_t) -> std::optional<std::string> {
           if (bytes.starts_with("ok")) return std::nullopt;
           return "not a payload of this model";
         });
  Node b(coordinator);
  introduce(coordinator, {&a, &b});
  const wire::CommitRecord bad_content = b.commit(2, "garbage");
  wire::CommitRecord forged = b.commit(2, "ok but unsigned");
  forged.set_signature(std::string(64, 'x'));
  const wire::CommitRecord good = b.commit(2, "ok fine");
  a.net->collect(2, {bad_content, forged, good}, {b.member()}, /*witness=*/true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\x04'));  // commit 2 held
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
  introduce(coordinator, {&a, &b});
  wire::CommitRecord record = b.commit(5, "x");
  record.set_payload_hash(std::string(32, 'z'));  // a hash b does not hold
  const auto missing = a.net->ensure(5, {record}, {b.member()}, 20);
  ASSERT_EQ(missing.size(), 1u);
}

// A payload's bytes carry their step: "payload@S" is valid for step S only.
std::optional<std::string> step_validator(std::string_view, std::string_view bytes, uint64_t step) {
  if (bytes == fmt::format("payload@{}", step)) return std::nullopt;
  return fmt::format("the payload is not for step {}", step);
}

TEST(PeerNetworkTest, HeldBytesCommittedForAnotherStepAreValidatedAndRefused) {
  FakeCoordinator coordinator;
  Node a(coordinator, step_validator), b(coordinator);
  introduce(coordinator, {&a, &b});
  const wire::CommitRecord first = b.commit(1, "payload@1");
  a.net->collect(1, {first}, {a.member(), b.member()}, /*witness=*/true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\x01'));
  // The same bytes, signed again by their author for step 5 (a replay): a holds them, but only
  // for step 1.
  const wire::CommitRecord replay = b.sign(5, first.payload_hash());
  a.net->collect(5, {replay}, {a.member(), b.member()}, /*witness=*/true);
  witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().step(), 5u);
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\0'));
  ASSERT_EQ(witness->witness().rejected_size(), 1);
  EXPECT_EQ(witness->witness().rejected(0).author(), b.id.public_key());
  EXPECT_EQ(a.net->counters().rejected_by_reason[static_cast<size_t>(Rejection::kLayout)], 1u);
  EXPECT_EQ(a.net->ensure(5, {replay}, {b.member()}, 5).size(), 1u);
  EXPECT_TRUE(a.net->blobs().holds(first.payload_hash(), 1));
}

TEST(PeerNetworkTest, AMemberClaimingAnotherMembersEndpointDoesNotHideIt) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator), thief(coordinator);
  wire::Member stolen = thief.member();
  stolen.set_endpoint(b.net->endpoint());  // the thief advertises b's endpoint
  introduce(coordinator, {&a, &b, &thief}, {a.member(), b.member(), stolen});
  // a first asks "the thief" at b's endpoint: b's server cannot answer under the thief's key.
  const wire::CommitRecord thiefs = thief.commit(2, "thief's payload");
  EXPECT_EQ(a.net->ensure(2, {thiefs}, {stolen}, 3).size(), 1u);
  // b stays reachable at its endpoint under its own key.
  const wire::CommitRecord bs = b.commit(2, "b's payload");
  const auto started = Clock::now();
  EXPECT_TRUE(a.net->ensure(2, {bs}, {stolen, b.member()}, 20).empty());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(), 2.0);
}

TEST(PeerNetworkTest, TheWitnessGoesOutByItsDeadlineWhateverOnePayloadDoes) {
  FakeCoordinator coordinator;
  // witness_seconds = 3: the Witness is due 1.95 s after the Collect, though a source may take
  // 10 s (blob_timeout_seconds) before the fix capped it.
  Node a(coordinator, {}, /*witness_seconds=*/3, /*blob_timeout_seconds=*/10);
  Node b(coordinator);
  // A member that is listed and committed but never answers (a server that does not reply).
  const net::Identity silent_id = net::Identity::generate();
  net::Context silent_context;
  net::Server silent(silent_context, silent_id, "tcp://127.0.0.1:*", {});
  wire::Member silent_member;
  silent_member.set_key(silent_id.public_key());
  silent_member.set_endpoint(silent.bound_endpoint());
  std::vector<wire::Member> members = {a.member(), b.member(), silent_member};
  for (int i = 0; i < 3; ++i) {  // more that never answer: 4 x 0.75 s outlast the deadline
    wire::Member m = silent_member;
    m.set_key(net::Identity::generate().public_key());
    members.push_back(m);
  }
  introduce(coordinator, {&a, &b}, members);
  wire::CommitRecord withheld;
  withheld.set_author(silent_id.public_key());
  withheld.set_step(4);
  withheld.set_payload_hash(blake2b256_bytes("withheld"));
  withheld.set_signature(
      silent_id.sign(net::commit_signing_bytes("run", 4, withheld.payload_hash())));
  const wire::CommitRecord good = b.commit(4, "b's payload");
  const auto started = Clock::now();
  a.net->collect(4, {withheld, good}, members, true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  const double took = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_TRUE(witness.has_value());
  EXPECT_LT(took, 2.8);
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\x02'));  // commit 1 held
  EXPECT_EQ(witness->witness().rejected_size(), 0);  // still being fetched: neither
  EXPECT_EQ(a.net->counters().witnesses_early, 1u);
}

TEST(PeerNetworkTest, APayloadArrivingAfterTheWitnessIsKept) {
  FakeCoordinator coordinator;
  // witness_seconds = 4: each source gets 1 s, the Witness is due at 2.6 s.
  Node a(coordinator, {}, /*witness_seconds=*/4, /*blob_timeout_seconds=*/10);
  // The author answers, but only 3 s after being asked; three members that never answer are
  // listed after it, so the fetch is still going when the author's answer comes.
  const net::Identity author_id = net::Identity::generate();
  net::Context author_context;
  net::Server author(author_context, author_id, "tcp://127.0.0.1:*", {});
  const std::string bytes = "slow payload";
  wire::CommitRecord record;
  record.set_author(author_id.public_key());
  record.set_step(7);
  record.set_payload_hash(blake2b256_bytes(bytes));
  record.set_signature(author_id.sign(net::commit_signing_bytes("run", 7, record.payload_hash())));
  std::vector<wire::Member> members = {a.member()};
  wire::Member m;
  m.set_key(author_id.public_key());
  m.set_endpoint(author.bound_endpoint());
  members.push_back(m);
  std::vector<net::Identity> silent(3, net::Identity::generate());
  for (auto& id : silent) {
    id = net::Identity::generate();
    m.set_key(id.public_key());  // at the author's endpoint: the handshake never completes
    members.push_back(m);
  }
  introduce(coordinator, {&a}, members);
  std::atomic<bool> stop{false};
  std::thread slow([&] {
    std::optional<net::Incoming> asked;
    while (!asked && !stop) {
      asked = author.recv();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!asked) return;
    std::this_thread::sleep_for(std::chrono::seconds(3));
    wire::Envelope reply;
    reply.mutable_blob()->set_hash(record.payload_hash());
    reply.mutable_blob()->set_data(bytes);
    author.send(asked->route, reply);
  });
  a.net->collect(7, {record}, members, true);
  auto witness = coordinator.wait_for(wire::Envelope::kWitness, 20);
  ASSERT_TRUE(witness.has_value());
  EXPECT_EQ(witness->witness().of_collect(), std::string(1, '\0'));
  for (int i = 0; i < 300 && !a.net->blobs().holds(record.payload_hash(), 7); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  slow.join();
  EXPECT_TRUE(a.net->blobs().holds(record.payload_hash(), 7));
  EXPECT_EQ(a.net->counters().payloads_late, 1u);
}

// Publishes on `holder` a one-tensor snapshot ("w", 4 bytes of `fill`) after `step` steps; returns
// its state record.
wire::StateRecord publish_one_tensor(Node& holder, uint64_t step, char fill) {
  auto snapshot = std::make_shared<Snapshot>();
  (*snapshot)["w"] = TensorBytes{"F32", {1}, std::string(4, fill)};
  holder.net->publish_snapshot(step, snapshot);
  wire::StateRecord state;
  state.set_applied_steps(step);
  state.add_tensor_names("w");
  state.add_tensor_hashes(blake2b256_bytes(std::string(4, fill)));
  return state;
}

TEST(PeerNetworkTest, StrangersGetNoDataAndAreCounted) {
  FakeCoordinator coordinator;
  Node a(coordinator), b(coordinator), stranger(coordinator);
  introduce(coordinator, {&a, &b});  // the stranger is nobody's member
  introduce(coordinator, {&stranger}, {a.member(), b.member(), stranger.member()});
  const wire::CommitRecord record = b.commit(1, "b's payload");
  EXPECT_EQ(stranger.net->ensure(1, {record}, {b.member()}, 2).size(), 1u);
  EXPECT_FALSE(stranger.net->blobs().contains(record.payload_hash()));
  EXPECT_GE(b.net->counters().refused_by_reason[static_cast<size_t>(Refusal::kNotMember)], 1u);
  const wire::StateRecord state = publish_one_tensor(b, 3, '\1');
  EXPECT_THROW(stranger.net->fetch_state(state, {b.member()}, 2), Error);
  // Once the coordinator lists it as joining, the same fetch works (a joiner retries).
  wire::Envelope start;
  *start.mutable_round_start()->add_members() = a.member();
  *start.mutable_round_start()->add_members() = b.member();
  *start.mutable_round_start()->add_joining() = stranger.member();
  coordinator.server.send(coordinator.routes.at(b.id.curve_public()), start);
  ASSERT_TRUE(b.net->next_from_coordinator(10).has_value());
  EXPECT_EQ(stranger.net->fetch_state(state, {b.member()}, 10).at("w").data, std::string(4, '\1'));
}

TEST(PeerNetworkTest, AJoinerRefusedAtFirstRetriesUntilListed) {
  FakeCoordinator coordinator;
  Node b(coordinator), joiner(coordinator);
  introduce(coordinator, {&b});
  const wire::StateRecord state = publish_one_tensor(b, 3, '\7');
  std::thread admit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    wire::Envelope start;
    *start.mutable_round_start()->add_members() = b.member();
    *start.mutable_round_start()->add_joining() = joiner.member();
    coordinator.server.send(coordinator.routes.at(b.id.curve_public()), start);
  });
  const Snapshot got = joiner.net->fetch_state(state, {b.member()}, 20);
  admit.join();
  EXPECT_EQ(got.at("w").data, std::string(4, '\7'));
  EXPECT_GE(b.net->counters().refused_by_reason[static_cast<size_t>(Refusal::kNotMember)], 1u);
}

// The coordinator's Admit (sent to every member when someone joins) admits the joiner by itself:
// a paused run sends no RoundStart.
TEST(PeerNetworkTest, AnAdmitLetsAJoinerFetch) {
  FakeCoordinator coordinator;
  Node b(coordinator), joiner(coordinator);
  introduce(coordinator, {&b});
  const wire::StateRecord state = publish_one_tensor(b, 2, '\5');
  wire::Envelope admit;
  *admit.mutable_admit()->add_joining() = joiner.member();
  coordinator.server.send(coordinator.routes.at(b.id.curve_public()), admit);
  const Snapshot got = joiner.net->fetch_state(state, {b.member()}, 20);
  EXPECT_EQ(got.at("w").data, std::string(4, '\5'));
}

// A member that speaks to b's server directly, as an attacker's own code would.
struct RawMember {
  net::Identity id = net::Identity::generate();
  std::unique_ptr<net::Client> client;
  wire::Member member(const std::string& endpoint = "tcp://127.0.0.1:1") const {
    wire::Member m;
    m.set_key(id.public_key());
    m.set_endpoint(endpoint);
    return m;
  }
  void connect(net::Context& context, const Node& server, int receive_queue = 0) {
    client =
        std::make_unique<net::Client>(context, id, server.net->endpoint(), server.id.public_key(),
                                      net::DecodeLimits{}, receive_queue);
  }
  std::optional<wire::Envelope> wait(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (auto m = client->recv()) return m;
      zmq::pollitem_t item{client->socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
};

wire::Envelope get_tensor(uint64_t step, const std::string& name) {
  wire::Envelope e;
  e.mutable_get_tensor()->set_applied_steps(step);
  e.mutable_get_tensor()->set_name(name);
  return e;
}

size_t refused(const Node& node, Refusal why) {
  return node.net->counters().refused_by_reason[static_cast<size_t>(why)];
}

TEST(PeerNetworkTest, RequestsLargerThanAnyValidOneGetNothing) {
  FakeCoordinator coordinator;
  Node b(coordinator);
  net::Context context;  // outlives raw's socket: closing a context waits for its sockets
  RawMember raw;
  introduce(coordinator, {&b}, {b.member(), raw.member()});
  raw.connect(context, b);
  raw.client->send(get_tensor(1, "w"));  // a valid request is answered (NotFound)
  auto reply = raw.wait(10);
  ASSERT_TRUE(reply.has_value());
  EXPECT_TRUE(reply->has_not_found());
  // 64 KiB of name: the server's socket drops the frame (and the connection) unread.
  raw.client->send(get_tensor(1, std::string(64 << 10, 'n')));
  EXPECT_FALSE(raw.wait(1).has_value());
  // A frame within the socket's bound but a name longer than any tensor's: refused, counted.
  raw.client->send(get_tensor(1, std::string(1500, 'n')));
  EXPECT_FALSE(raw.wait(1).has_value());
  EXPECT_EQ(refused(b, Refusal::kBadRequest), 1u);
}

TEST(PeerNetworkTest, AFloodIsRateLimitedAndTheHeartbeatGoesOn) {
  FakeCoordinator coordinator;
  Node b(coordinator);
  net::Context context;  // outlives raw's socket: closing a context waits for its sockets
  RawMember raw;
  introduce(coordinator, {&b}, {b.member(), raw.member()});
  raw.connect(context, b);
  wire::Envelope ask;
  ask.mutable_get_blob()->set_hash(std::string(32, 'h'));
  const std::string curve = b.id.curve_public();
  const uint64_t before = coordinator.heartbeats[curve];
  const auto end = Clock::now() + std::chrono::seconds(3);
  uint64_t sent = 0;
  while (Clock::now() < end) {
    for (int i = 0; i < 200; ++i, ++sent) raw.client->send(ask);
    while (raw.client->recv()) {
    }
    coordinator.pump(0.001);
  }
  coordinator.pump(0.5);
  // One heartbeat a second throughout.
  EXPECT_GE(coordinator.heartbeats[curve] - before, 2u) << sent << " requests sent";
  EXPECT_GT(refused(b, Refusal::kMemberRate) + refused(b, Refusal::kConnectionRate), 0u);
}

TEST(PeerNetworkTest, RepliesWaitingPerConnectionAreBounded) {
  FakeCoordinator coordinator;
  Node b(coordinator);
  net::Context context;  // outlives raw's socket: closing a context waits for its sockets
  RawMember raw;
  introduce(coordinator, {&b}, {b.member(), raw.member()});
  auto snapshot = std::make_shared<Snapshot>();
  (*snapshot)["big"] = TensorBytes{"F32", {1 << 22}, std::string(16 << 20, '\3')};
  b.net->publish_snapshot(2, snapshot);
  raw.connect(context, b, /*receive_queue=*/1);  // reads slowly: TCP pushes back on b
  // 200 asks for a 16 MiB tensor, none read: without a bound, 3.2 GB would queue at b.
  for (int i = 0; i < 200; ++i) raw.client->send(get_tensor(2, "big"));
  // The server reads a bounded number of requests per poll: on a loaded machine the first
  // refusals come before it has read all 200, so wait for the count, not for the first one.
  for (int i = 0; i < 1000 && refused(b, Refusal::kReplyQueue) <= 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(refused(b, Refusal::kReplyQueue), 100u);
  // What was queued is delivered whole.
  auto reply = raw.wait(20);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->tensor_data().data().size(), 16u << 20);
}

TEST(PeerNetworkTest, RepliesLargerThanTheRunAllowsOrUnaskedAreDropped) {
  FakeCoordinator coordinator;
  // Payloads of this run are at most 1000 bytes: a fetch connection takes replies up to ~5 KB.
  Node a(coordinator, {}, 10, 2, /*max_payload_bytes=*/1000);
  const net::Identity bad_id = net::Identity::generate();
  net::Context bad_context;
  net::Server bad(bad_context, bad_id, "tcp://127.0.0.1:*", {});
  wire::Member bad_member;
  bad_member.set_key(bad_id.public_key());
  bad_member.set_endpoint(bad.bound_endpoint());
  introduce(coordinator, {&a}, {a.member(), bad_member});
  const std::string bytes = "the payload";
  wire::CommitRecord record;
  record.set_author(bad_id.public_key());
  record.set_step(1);
  record.set_payload_hash(blake2b256_bytes(bytes));
  record.set_signature(bad_id.sign(net::commit_signing_bytes("run", 1, record.payload_hash())));
  const auto next_request = [&]() -> std::optional<net::Incoming> {
    for (int i = 0; i < 1000; ++i) {
      if (auto in = bad.recv()) return in;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  };
  std::thread server([&] {
    auto asked = next_request();
    if (!asked) return;
    wire::Envelope unasked;
    unasked.mutable_not_found()->set_what("something nobody asked for");
    bad.send(asked->route, unasked);
    wire::Envelope good;
    good.mutable_blob()->set_hash(record.payload_hash());
    good.mutable_blob()->set_data(bytes);
    bad.send(asked->route, good);
    // The next request gets 1 MiB where 1000 bytes are the most a payload can be.
    asked = next_request();
    if (!asked) return;
    wire::Envelope huge;
    huge.mutable_blob()->set_hash(asked->message.get_blob().hash());
    huge.mutable_blob()->set_data(std::string(1 << 20, 'x'));
    bad.send(asked->route, huge);
  });
  EXPECT_TRUE(a.net->ensure(1, {record}, {bad_member}, 10).empty());
  EXPECT_EQ(a.net->counters().unsolicited_replies, 1u);
  wire::CommitRecord second = record;
  second.set_payload_hash(blake2b256_bytes("another"));
  second.set_signature(bad_id.sign(net::commit_signing_bytes("run", 1, second.payload_hash())));
  EXPECT_EQ(a.net->ensure(1, {second}, {bad_member}, 10).size(), 1u);
  server.join();
  // ZeroMQ closed the connection at the frame's size: the bytes never reached the decoder (with
  // the old 1 GiB limit they were parsed, then refused for their hash).
  EXPECT_EQ(a.net->counters().rejected_by_reason[static_cast<size_t>(Rejection::kHash)], 0u);
  EXPECT_FALSE(a.net->blobs().contains(second.payload_hash()));
}

TEST(PeerNetworkTest, ConnectionsToMembersWhoLeftAreClosed) {
  FakeCoordinator coordinator;
  // A member dropped from the list is forgotten after 0.2 s instead of 60 s.
  Node a(coordinator, {}, 10, 2, 0, /*grace_seconds=*/0.2);
  Node b(coordinator), c(coordinator);
  introduce(coordinator, {&a, &b, &c});
  const wire::CommitRecord from_b = b.commit(1, "b's"), from_c = c.commit(1, "c's");
  EXPECT_TRUE(a.net->ensure(1, {from_b, from_c}, {b.member(), c.member()}, 10).empty());
  const auto open_now = [&] {
    // Connections are looked over every kCleanupSeconds.
    std::this_thread::sleep_for(std::chrono::duration<double>(kCleanupSeconds + 0.5));
    return a.net->counters().connections_open;
  };
  EXPECT_EQ(open_now(), 2u);
  introduce(coordinator, {&a}, {a.member(), b.member()});  // c left the run
  EXPECT_EQ(open_now(), 1u);
}

}  // namespace
}  // namespace agora::peer
