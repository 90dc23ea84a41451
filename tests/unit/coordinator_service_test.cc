// The coordinator service with real sockets: its loop keeps the clock whatever members send.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "agora/config/run_config.h"
#include "agora/coord/service.h"
#include "agora/coord/store.h"
#include "agora/net/curve_socket.h"
#include "agora/net/envelope.h"
#include "test_support.h"

namespace agora::coord {
namespace {

using Clock = std::chrono::steady_clock;
using net::Client;
using net::Identity;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The next message from `client` for which `accept` holds, within `seconds`.
template <typename Accept>
std::optional<wire::Envelope> wait_for(Client& client, double seconds, Accept accept) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (auto m = client.recv()) {
      if (accept(*m)) return m;
      continue;
    }
    zmq::pollitem_t item{client.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

wire::Envelope join_msg(const Identity& id, int port) {
  wire::Envelope e;
  e.mutable_join()->set_key(id.public_key());
  e.mutable_join()->set_endpoint(fmt::format("tcp://127.0.0.1:{}", port));
  e.mutable_join()->set_agent("service test");
  return e;
}

class CoordinatorServiceTest : public testing::TempDirTest {
 protected:
  // Starts a coordinator on a free local port; returns its endpoint.
  std::string start(const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {"network.listen=\"tcp://127.0.0.1:*\"",
                                    fmt::format("network.state_db=\"{}\"",
                                                (dir_ / "coordinator.db").string())};
    all.insert(all.end(), overrides.begin(), overrides.end());
    config_ = RunConfig::parse("", "<service test>", all);
    std::promise<std::string> bound;
    auto endpoint = bound.get_future();
    ServiceOptions options;
    options.base_dir = dir_;
    options.on_listening = [&bound](const std::string& e) { bound.set_value(e); };
    coordinator_ = std::thread([this, options] {
      try {
        run_coordinator(config_, identity_, options, stop_);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the coordinator failed: " << e.what();
      }
    });
    EXPECT_EQ(endpoint.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    return endpoint.get();
  }

  void TearDown() override {
    stop_ = true;
    if (coordinator_.joinable()) coordinator_.join();
    testing::TempDirTest::TearDown();
  }

  RunConfig config_;
  Identity identity_ = Identity::generate();
  std::atomic<bool> stop_{false};
  std::thread coordinator_;
};

// Issue 13, item 4: a member sending heartbeats as fast as it can must not hold a round open
// past its deadline (before the fix the loop handled every waiting message, each with its own
// SQLite save, before its tick, and the deadline never fired while the flood lasted).
TEST_F(CoordinatorServiceTest, AHeartbeatFloodDoesNotDelayADeadline) {
  const double deadline = 1.0;
  const std::string endpoint =
      start({"network.min_peers=2", "network.warmup_seconds=0.0",
             fmt::format("network.min_deadline_seconds={}", deadline),
             "network.witness_seconds=1.0", "network.heartbeat_timeout_seconds=60.0",
             "network.max_strikes=1000", "schedule.warmup_steps=0", "train.steps=5"});
  net::Context context;
  const net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};

  // The flooder: joins, then sends heartbeats in a tight loop until told to stop.
  std::atomic<bool> flooding{true}, welcomed{false};
  std::atomic<uint64_t> sent{0};
  std::thread flooder([&] {
    const Identity id = Identity::generate();
    Client client(context, id, endpoint, identity_.public_key(), control);
    client.send(join_msg(id, 7601));
    welcomed = wait_for(client, 10, [](const wire::Envelope& m) { return m.has_welcome(); })
                   .has_value();
    wire::Envelope heartbeat;
    heartbeat.mutable_heartbeat()->set_applied_steps(0);
    heartbeat.mutable_heartbeat()->set_next_round(0);
    while (flooding) {
      client.send(heartbeat);
      ++sent;
      while (client.recv()) {
      }
    }
  });

  const Identity honest = Identity::generate();
  Client client(context, honest, endpoint, identity_.public_key(), control);
  client.send(join_msg(honest, 7602));
  ASSERT_TRUE(wait_for(client, 10, [](const wire::Envelope& m) { return m.has_welcome(); }));
  const auto round = [](uint64_t step) {
    return [step](const wire::Envelope& m) {
      return m.has_round_start() && m.round_start().step() == step;
    };
  };
  const auto first = wait_for(client, 15, round(0));
  const auto opened = Clock::now();
  ASSERT_TRUE(first.has_value()) << "round 0 never opened during the flood";
  // Nobody commits: round 0 closes at its deadline, step 0 finalizes empty, round 1 opens.
  const auto next = wait_for(client, 15, round(1));
  const double took = seconds_since(opened);
  flooding = false;
  flooder.join();
  EXPECT_TRUE(welcomed);
  ASSERT_TRUE(next.has_value()) << "round 0's deadline never fired during the flood";
  EXPECT_LT(took, first->round_start().deadline_seconds() + 1.5);
  EXPECT_GT(sent.load(), 1000u) << "the flood was not a flood";

  stop_ = true;
  coordinator_.join();
  const auto state = Store::open(dir_ / "coordinator.db").load();
  ASSERT_TRUE(state.has_value());
  EXPECT_GE(state->counters.rounds_opened, 2u);
  EXPECT_GE(state->counters.deadline_misses, 2u);  // both members, round 0
}

}  // namespace
}  // namespace agora::coord
