// serve/param_feed.h over real CURVE sockets: a follower catches up by the chain of deltas when
// the feed still keeps them and by one whole copy when it does not, a delta whose hash does not
// hold makes it ask for the whole, and the byte limits hold back all but a member's first reply.
//
// The "parameters" here are a string: a delta appends its payload, a whole copy replaces it, and
// the state hash is the string itself, so what the follower holds is easy to check.
#include "agora/serve/param_feed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "agora/core/error.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"
#include "agora/serve/member_client.h"
#include "agora/serve/poll.h"

namespace agora::serve {
namespace {

net::Identity identity(uint8_t seed) {
  return net::Identity::from_seed(std::string(32, static_cast<char>(seed)));
}

// A server whose parameters are `text` at version `version`, publishing through a feed.
struct FeedServer {
  explicit FeedServer(ParamFeed::Limits limits)
      : server(context, id, "tcp://127.0.0.1:*", net::DecodeLimits{}),
        feed(limits, [this] { ++wholes_made; return text; }, 0, "") {}

  // Appends `delta`; the feed sends `sent` instead when given (bytes corrupted on the way).
  void publish(const std::string& delta, const std::string& sent = "") {
    text += delta;
    feed.publish(feed.version() + 1, sent.empty() ? delta : sent, text);
  }

  // Answers asks until `done`.
  void serve_until(const std::atomic<bool>& done) {
    while (!done) {
      wait_readable(server.socket(), std::chrono::milliseconds(5));
      drain(server, {}, [&](const net::Incoming& in) {
        if (!in.message.has_get_params()) return;
        const ParamFeed::Answer a =
            feed.answer(server, in.route, in.message.get_params(), in_flight, *in_flight);
        delta_bytes += a.delta_bytes;
        whole_bytes += a.whole_bytes;
      });
    }
  }

  net::Context context;
  net::Identity id = identity(1);
  net::Server server;
  std::string text;
  int wholes_made = 0;
  ParamFeed feed;
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
  int64_t delta_bytes = 0, whole_bytes = 0;
};

// A follower on its own thread, holding `text`.
struct Follower {
  explicit Follower(FeedServer& s, uint8_t seed = 2)
      : me(identity(seed)),
        client(s.context, me, s.server.bound_endpoint(), s.id.public_key(), net::DecodeLimits{}),
        member(client, wire::Envelope{}, [](const wire::Envelope&) {},
               [](const std::string&) {}),
        follower(member, 0, [this](const wire::Params& p) {
          if (p.payload() == "garbage") fail("the payload does not decode");
          text = p.whole() ? p.payload() : text + p.payload();
          return text;
        }) {}

  // Syncs to `target` while `server` answers; true when it got there.
  bool sync(FeedServer& server, uint64_t target) {
    std::atomic<bool> done = false;
    bool ok = false;
    std::thread t([&] {
      ok = follower.sync(target, /*wait_seconds=*/2.0);
      done = true;
    });
    server.serve_until(done);
    t.join();
    return ok;
  }

  net::Identity me;
  net::Client client;
  MemberClient member;
  std::string text;
  ParamFollower follower;
};

ParamFeed::Limits limits(size_t deltas_kept) {
  ParamFeed::Limits l;
  l.deltas_kept = deltas_kept;
  return l;
}

TEST(ParamFeed, AFollowerCatchesUpByTheChainOfDeltas) {
  FeedServer s(limits(8));
  for (const char* d : {"a", "b", "c"}) s.publish(d);
  Follower f(s);
  ASSERT_TRUE(f.sync(s, 3));
  EXPECT_EQ(f.text, "abc");
  EXPECT_EQ(f.follower.version(), 3u);
  s.publish("d");
  s.publish("e");
  ASSERT_TRUE(f.sync(s, 5));
  EXPECT_EQ(f.text, "abcde");
  EXPECT_EQ(s.wholes_made, 0);
  EXPECT_EQ(s.whole_bytes, 0);
  EXPECT_GT(s.delta_bytes, 0);
  EXPECT_EQ(f.follower.bytes(), s.delta_bytes);  // what was sent is what was read
  EXPECT_EQ(f.follower.hash_mismatches(), 0);
}

TEST(ParamFeed, OneTooFarBehindGetsOneWholeCopyEncodedOnce) {
  FeedServer s(limits(2));
  for (const char* d : {"a", "b", "c", "d"}) s.publish(d);  // deltas kept: 3 and 4
  Follower f(s, 2), g(s, 3);
  ASSERT_TRUE(f.sync(s, 4));
  ASSERT_TRUE(g.sync(s, 4));
  EXPECT_EQ(f.text, "abcd");
  EXPECT_EQ(g.text, "abcd");
  EXPECT_EQ(s.wholes_made, 1);  // shared by both
  EXPECT_EQ(s.delta_bytes, 0);
  s.publish("e");
  ASSERT_TRUE(f.sync(s, 5));  // one behind: a delta again
  EXPECT_EQ(f.text, "abcde");
  EXPECT_GT(s.delta_bytes, 0);
}

TEST(ParamFeed, ADeltaWhoseHashDoesNotHoldBringsAWholeCopy) {
  FeedServer s(limits(8));
  s.publish("a");
  s.publish("b", /*sent=*/"X");
  Follower f(s);
  ASSERT_TRUE(f.sync(s, 2));
  EXPECT_EQ(f.text, "ab");
  EXPECT_EQ(f.follower.hash_mismatches(), 1);
  EXPECT_EQ(s.wholes_made, 1);
}

TEST(ParamFeed, BytesTheFollowerCannotApplyEndTheSyncAfterItsAsks) {
  FeedServer s(limits(8));
  s.publish("garbage");
  Follower f(s);
  EXPECT_FALSE(f.sync(s, 1));  // every copy, whole or delta, is garbage: no version reached
  EXPECT_EQ(f.follower.version(), 0u);
  EXPECT_GT(f.follower.hash_mismatches(), 1);
}

TEST(ParamFeed, TheLimitsHoldBackAllButAMembersFirstReply) {
  ParamFeed::Limits l = limits(8);
  l.bytes_per_member = 1;
  l.bytes_in_flight = 1;
  FeedServer s(l);
  for (const char* d : {"a", "b", "c"}) s.publish(d);
  Follower f(s);
  wire::Envelope ask;
  ask.mutable_get_params()->set_have_version(0);
  f.client.send(ask);
  std::optional<net::Incoming> in;
  for (int i = 0; i < 200 && !in; ++i) {
    wait_readable(s.server.socket(), std::chrono::milliseconds(10));
    in = s.server.recv();
  }
  ASSERT_TRUE(in.has_value());
  // Something already waits for this member: the first delta is over both limits.
  *s.in_flight = 1;
  ParamFeed::Answer a = s.feed.answer(s.server, in->route, in->message.get_params(), s.in_flight, 1);
  EXPECT_TRUE(a.busy);
  EXPECT_EQ(a.delta_bytes, 0);
  // Nothing waits: one reply goes, whatever its size. (Whether the rest of the chain waits for
  // the next ask depends on how fast ZeroMQ writes the first, so it is not checked here.)
  *s.in_flight = 0;
  a = s.feed.answer(s.server, in->route, in->message.get_params(), s.in_flight, 0);
  EXPECT_GT(a.delta_bytes, 0);
}

TEST(ParamFeed, RefusesVersionsOutOfOrderAndLimitsBelowOne) {
  FeedServer s(limits(8));
  EXPECT_THROW(s.feed.publish(2, "x", "x"), Error);
  EXPECT_THROW(s.feed.publish(0, "x", "x"), Error);
  ParamFeed::Limits l;
  l.deltas_kept = 0;
  EXPECT_THROW(ParamFeed(l, [] { return std::string(); }, 0, ""), Error);
  // A restart's reset: the feed goes on from the restored version, with no deltas before it.
  s.publish("a");
  s.feed.reset(7, "restored");
  EXPECT_EQ(s.feed.version(), 7u);
  EXPECT_NO_THROW(s.feed.publish(8, "b", "restored b"));
}

}  // namespace
}  // namespace agora::serve
