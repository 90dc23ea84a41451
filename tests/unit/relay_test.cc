// The coordinator's relay for members nobody can dial (coord/relay.h, coord/reachability.h):
// what it keeps, for whom, how much, and the probe that decides who needs it.
#include "agora/coord/relay.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "agora/core/hash.h"
#include "agora/net/curve_socket.h"

namespace agora::coord {
namespace {

// Keys only name members here: no signature is checked.
net::PublicKey key(int i) { return std::string(32, static_cast<char>('a' + i)); }

TEST(RelayStoreTest, KeepsWhatHashesToTheCommitmentAndServesEachMemberABoundedNumberOfTimes) {
  RelayStore store(RelayStore::Limits{.fetches_per_member = 2});
  const std::string data = "a payload";
  const std::string hash = blake2b256_bytes(data);
  EXPECT_NE(store.put(key(0), 3, hash, "other bytes"), "");  // not what was committed
  EXPECT_FALSE(store.holds(hash));
  EXPECT_EQ(store.put(key(0), 3, hash, data), "");
  EXPECT_EQ(store.put(key(0), 3, hash, data), "");  // a repeat changes nothing
  EXPECT_EQ(store.bytes_held(), data.size());
  for (int i = 0; i < 2; ++i) {
    const auto got = store.get(key(1), hash);
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, data);
  }
  EXPECT_FALSE(store.get(key(1), hash));  // its fetches are used up
  EXPECT_TRUE(store.get(key(2), hash));   // another member's are not
  EXPECT_FALSE(store.get(key(1), blake2b256_bytes("unknown")));
  EXPECT_EQ(store.bytes_in(), data.size());
  EXPECT_EQ(store.bytes_out(), 3 * data.size());
  EXPECT_EQ(store.bytes_for_step(3), 4 * data.size());
}

TEST(RelayStoreTest, SizeAndTotalAreBoundedAndOldStepsForgotten) {
  RelayStore store(RelayStore::Limits{.max_blob_bytes = 10, .max_bytes = 25, .keep_steps = 4});
  const auto put = [&](uint64_t step, const std::string& data) {
    return store.put(key(0), step, blake2b256_bytes(data), data);
  };
  EXPECT_NE(put(1, std::string(11, 'x')), "");  // larger than a blob may be
  EXPECT_EQ(put(1, std::string(10, 'a')), "");
  EXPECT_EQ(put(2, std::string(10, 'b')), "");
  EXPECT_EQ(put(3, std::string(10, 'c')), "");  // 30 > 25: step 1's blob makes room
  EXPECT_FALSE(store.holds(blake2b256_bytes(std::string(10, 'a'))));
  EXPECT_EQ(store.bytes_held(), 20u);
  EXPECT_NE(put(2, std::string(10, 'd')), "");  // only its own step and newer ones are left
  EXPECT_EQ(store.bytes_held(), 20u);
  store.prune(7);  // keeps steps >= 3
  EXPECT_EQ(store.blobs(), 1u);
  EXPECT_EQ(store.bytes_held(), 10u);
  store.prune(100);
  EXPECT_EQ(store.blobs(), 0u);
  EXPECT_EQ(store.bytes_held(), 0u);
}

TEST(RelayStoreTest, OnlyAnAuthorsOwnCommitmentOfAStepNotYetFinalFindsAStep) {
  RunState state;
  OpenRound round;
  round.step = 7;
  round.commits[key(0)] = CommitRecord{key(0), 7, "h7", "sig"};
  state.round = round;
  CollectingStep collecting;
  collecting.step = 6;
  collecting.commits.push_back(CommitRecord{key(1), 6, "h6", "sig"});
  state.collecting[6] = collecting;
  EXPECT_EQ(committed_step(state, key(0), "h7"), 7u);
  EXPECT_EQ(committed_step(state, key(1), "h6"), 6u);
  EXPECT_FALSE(committed_step(state, key(1), "h7"));  // another author's commitment
  EXPECT_FALSE(committed_step(state, key(0), "h6"));
  EXPECT_FALSE(committed_step(state, key(2), "nothing"));
}

// A real server answers the probe (even a stranger's GetBlob gets an answer); a port nobody
// listens on does not, and neither does a server holding another key than the one expected.
TEST(ProberTest, TellsAnEndpointThatAnswersFromOneThatDoesNot) {
  net::Context context;
  const net::Identity prober_id = net::Identity::generate();
  const net::Identity member = net::Identity::generate();
  const net::Identity other = net::Identity::generate();
  const net::DecodeLimits limits{net::kMaxControlBytes, net::kMaxControlBytes};
  net::Server server(context, member, "tcp://127.0.0.1:*", limits);
  const std::string open = server.bound_endpoint();
  std::atomic<bool> stop{false};
  std::thread answer([&] {
    while (!stop) {
      zmq::pollitem_t item{server.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      while (auto in = server.recv()) {
        wire::Envelope reply;
        reply.mutable_not_found()->set_what("no");
        server.send(in->route, reply);
      }
    }
  });
  Prober prober(context, prober_id, 1.5);
  prober.probe(member.public_key(), open);
  prober.probe(other.public_key(), open);  // the handshake fails: not its key
  net::Context scratch;
  const net::Identity unused = net::Identity::generate();
  net::Server closed_server(scratch, unused, "tcp://127.0.0.1:*", limits);
  const std::string closed = closed_server.bound_endpoint();
  closed_server.socket().unbind(closed);
  const net::Identity nat = net::Identity::generate();
  prober.probe(nat.public_key(), closed);
  std::map<net::PublicKey, bool> answers;
  for (int i = 0; i < 100 && answers.size() < 3; ++i) {
    for (const ProbeResult& r : prober.results()) answers[r.key] = r.reachable;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  answer.join();
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_TRUE(answers[member.public_key()]);
  EXPECT_FALSE(answers[other.public_key()]);
  EXPECT_FALSE(answers[nat.public_key()]);
}

}  // namespace
}  // namespace agora::coord
