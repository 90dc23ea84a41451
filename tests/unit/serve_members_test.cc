// serve/members.h: the life of a key in every role (stranger, member, banned, forgotten), on a
// hand-driven clock; serve/poll.h: a signal ends a wait instead of the process.
#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/serve/members.h"
#include "agora/serve/poll.h"

namespace agora::serve {
namespace {

struct State {
  int held = 0;
};

net::Identity identity(uint8_t seed) {
  return net::Identity::from_seed(std::string(32, static_cast<char>(seed)));
}

MemberLimits small_limits() {
  MemberLimits l;
  l.max_members = 2;
  l.max_banned = 1;
  l.idle_seconds = 10;
  l.member_rate = 1;
  l.member_burst = 3;
  l.stranger_rate = 2;
  l.stranger_burst = 4;
  return l;
}

TEST(ServeMembers, AHelloMustNameTheConnectionsOwnKey) {
  Members<State> members(small_limits());
  const net::Identity a = identity(1), b = identity(2);
  EXPECT_TRUE(proves_key(a.public_key(), a.curve_public()));
  EXPECT_FALSE(proves_key(b.public_key(), a.curve_public()));
  EXPECT_FALSE(proves_key("short", a.curve_public()));
  EXPECT_FALSE(proves_key(std::string(32, '\xff'), a.curve_public()));  // not a curve point
  const auto lie = members.join(a.curve_public(), b.public_key(), 0);
  EXPECT_EQ(lie.member, nullptr);
  EXPECT_NE(lie.refused.find("another ed25519 key"), std::string::npos);
  const auto ok = members.join(a.curve_public(), a.public_key(), 0);
  ASSERT_NE(ok.member, nullptr);
  EXPECT_TRUE(ok.fresh);
  EXPECT_EQ(ok.member->name, net::key_to_hex(a.public_key()));
  EXPECT_FALSE(members.join(a.curve_public(), a.public_key(), 1).fresh);  // the same member
  EXPECT_EQ(members.size(), 1u);
}

TEST(ServeMembers, StrangersShareOneBucketAndMembersHaveTheirOwn) {
  Members<State> members(small_limits());
  // Four strangers' messages at once (the burst), then none until the bucket refills: however
  // many keys, together.
  int passed = 0;
  for (int i = 0; i < 20; ++i) {
    passed += members.admit(identity(static_cast<uint8_t>(10 + i)).curve_public(), 0).standing ==
              Standing::kStranger;
  }
  EXPECT_EQ(passed, 4);
  EXPECT_EQ(members.admit(identity(50).curve_public(), 1.0).standing, Standing::kStranger);
  // A member is not throttled by the strangers: its own burst of 3.
  const net::Identity a = identity(1);
  ASSERT_NE(members.join(a.curve_public(), a.public_key(), 1.0).member, nullptr);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(members.admit(a.curve_public(), 1.0).standing, Standing::kMember);
  EXPECT_EQ(members.admit(a.curve_public(), 1.0).standing, Standing::kThrottled);
  EXPECT_EQ(members.admit(a.curve_public(), 2.0).standing, Standing::kMember);  // 1 a second
}

TEST(ServeMembers, TheCapCountsMembersNotBannedAndBansOutliveReconnection) {
  Members<State> members(small_limits());
  const net::Identity a = identity(1), b = identity(2), c = identity(3), d = identity(4);
  Members<State>::Entry* ma = members.join(a.curve_public(), a.public_key(), 0).member;
  ASSERT_NE(ma, nullptr);
  ASSERT_NE(members.join(b.curve_public(), b.public_key(), 0).member, nullptr);
  const auto full = members.join(c.curve_public(), c.public_key(), 0);
  EXPECT_EQ(full.member, nullptr);
  EXPECT_NE(full.refused.find("at most 2 members"), std::string::npos);
  members.ban(*ma);
  EXPECT_EQ(members.serving(), 1);
  EXPECT_NE(members.join(c.curve_public(), c.public_key(), 0).member, nullptr);  // a's place
  // The banned key says hello again: still banned, and its messages say so.
  const auto again = members.join(a.curve_public(), a.public_key(), 1);
  ASSERT_NE(again.member, nullptr);
  EXPECT_TRUE(again.member->banned);
  EXPECT_EQ(members.admit(a.curve_public(), 1).standing, Standing::kBanned);
  // At most max_banned (1) bans are kept: banning another forgets the longest silent.
  members.ban(*members.find(b.curve_public()));
  EXPECT_EQ(members.find(b.curve_public())->banned, true);
  EXPECT_EQ(members.find(a.curve_public()), nullptr);
  EXPECT_NE(members.join(d.curve_public(), d.public_key(), 2).member, nullptr);
}

TEST(ServeMembers, SilentMembersAreForgottenUnlessTheRoleKeepsThem) {
  Members<State> members(small_limits());
  const net::Identity a = identity(1), b = identity(2);
  members.join(a.curve_public(), a.public_key(), 0).member->held = 5;
  members.join(b.curve_public(), b.public_key(), 0);
  members.admit(b.curve_public(), 8);  // b spoke at 8
  int released = 0;
  members.evict_idle(10.5, [&](Members<State>::Entry& m) {
    released += m.held;
    return true;
  });
  EXPECT_EQ(released, 5);
  EXPECT_EQ(members.find(a.curve_public()), nullptr);
  ASSERT_NE(members.find(b.curve_public()), nullptr);
  // The role may keep one a while longer (bytes still queued to it).
  members.evict_idle(30, [](Members<State>::Entry&) { return false; });
  EXPECT_NE(members.find(b.curve_public()), nullptr);
  // A forgotten key is a stranger again, and may say hello anew.
  EXPECT_EQ(members.admit(a.curve_public(), 30).standing, Standing::kStranger);
  EXPECT_TRUE(members.join(a.curve_public(), a.public_key(), 30).fresh);
}

TEST(ServeMembers, TheOneRefusal) {
  const wire::Envelope e = refusal(kNotAMember, true);
  ASSERT_TRUE(e.has_refused());
  EXPECT_EQ(e.refused().reason(), kNotAMember);
  EXPECT_TRUE(e.refused().may_rejoin());
}

extern "C" void ignore_signal(int) {}

TEST(ServePoll, ASignalEndsTheWaitInsteadOfThrowing) {
  // A handler without SA_RESTART, as agora's Ctrl-C handler: zmq_poll fails with EINTR.
  struct sigaction action {};
  action.sa_handler = ignore_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous {};
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  net::Context context;
  const net::Identity server_id = identity(7);
  net::Server server(context, server_id, "tcp://127.0.0.1:*", net::DecodeLimits{});
  const pthread_t waiter = pthread_self();
  std::thread signaller([waiter] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    pthread_kill(waiter, SIGUSR1);
  });
  const auto started = std::chrono::steady_clock::now();
  bool readable = true;
  EXPECT_NO_THROW(readable = wait_readable(server.socket(), std::chrono::milliseconds(5000)));
  signaller.join();
  EXPECT_FALSE(readable);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(4));
  sigaction(SIGUSR1, &previous, nullptr);
}

TEST(ServePoll, DrainStopsAtTheBatchBound) {
  net::Context context;
  const net::Identity server_id = identity(7), client_id = identity(8);
  net::Server server(context, server_id, "tcp://127.0.0.1:*", net::DecodeLimits{});
  net::Client client(context, client_id, server.bound_endpoint(), server_id.public_key(),
                     net::DecodeLimits{});
  wire::Envelope e;
  e.mutable_heartbeat();
  for (int i = 0; i < 10; ++i) client.send(e);
  size_t seen = 0;
  for (int i = 0; i < 200 && seen < 10; ++i) {
    wait_readable(server.socket(), std::chrono::milliseconds(20));
    const size_t n = drain(server, {3, 1.0}, [&](const net::Incoming& in) {
      EXPECT_EQ(in.curve_key, client_id.curve_public());
    });
    EXPECT_LE(n, 3u);
    seen += n;
  }
  EXPECT_EQ(seen, 10u);
}

}  // namespace
}  // namespace agora::serve
