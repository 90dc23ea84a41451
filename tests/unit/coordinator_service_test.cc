// The coordinator service with real sockets: its loop keeps the clock whatever members send.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
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
    std::vector<std::string> all = {
        "network.listen=\"tcp://127.0.0.1:*\"",
        fmt::format("network.state_db=\"{}\"", (dir_ / "coordinator.db").string()),
        "network.open=true",  // the test's clients have fresh keys
        // These clients commit bare payload hashes, with no strategy state to check.
        "verify.rate=0"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    config_ = RunConfig::parse("", "<service test>", all);
    auto endpoint = bound_.get_future();
    ServiceOptions options;
    options.base_dir = dir_;
    options.http = obs::HttpAddress{"127.0.0.1", 0};
    options.on_listening = [this](const std::string& e, int http_port) {
      http_port_ = http_port;
      bound_.set_value(e);
    };
    coordinator_ = std::thread([this, options] {
      try {
        run_coordinator(config_, identity_, options, stop_);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the coordinator failed: " << e.what();
      }
    });
    // A coordinator that failed to start fails the test now, not at ctest's timeout.
    if (endpoint.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      throw std::runtime_error("the coordinator did not start listening within 30 s");
    }
    return endpoint.get();
  }

  void TearDown() override {
    stop_ = true;
    if (coordinator_.joinable()) coordinator_.join();
    testing::TempDirTest::TearDown();
  }

  // The value of counter `name` on the coordinator's /metrics; -1 when absent.
  double metric(const std::string& name) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(http_port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      const std::string request =
          fmt::format("GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", http_port_);
      (void)!::write(fd, request.data(), request.size());
      char buffer[4096];
      for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) reply.append(buffer, n);
    }
    ::close(fd);
    const size_t at = reply.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(reply.substr(at + name.size() + 2));
  }

  RunConfig config_;
  int http_port_ = 0;
  std::promise<std::string> bound_;  // a member: a late on_listening never writes freed memory
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
    welcomed =
        wait_for(client, 10, [](const wire::Envelope& m) { return m.has_welcome(); }).has_value();
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
  const double throttled = metric("agora_run_messages_throttled_total");
  flooding = false;
  flooder.join();
  EXPECT_TRUE(welcomed);
  ASSERT_TRUE(next.has_value()) << "round 0's deadline never fired during the flood";
  EXPECT_LT(took, first->round_start().deadline_seconds() + 3.0);
  EXPECT_GT(sent.load(), 1000u) << "the flood was not a flood";
  // The excess over the budget (100 a second, bursts of 1000) was dropped and counted.
  EXPECT_GT(throttled, 0.0);

  stop_ = true;
  coordinator_.join();
  const auto state = Store::open(dir_ / "coordinator.db").load();
  ASSERT_TRUE(state.has_value());
  EXPECT_GE(state->counters.rounds_opened, 2u);
  EXPECT_GE(state->counters.deadline_misses, 2u);  // both members, round 0
}

// Issue 13: the loss the table, page and metrics show is the median of the final payloads'
// claims (one member's claim cannot move it), and a rejected commit's figures are never used
// (before: the mean, fed by whatever Commit message arrived last, accepted or not).
TEST_F(CoordinatorServiceTest, TheStepLossIsTheMedianOfAcceptedFinalCommits) {
  const std::string endpoint =
      start({"network.min_peers=3", "network.warmup_seconds=0.0", "network.overlap=0",
             "network.heartbeat_timeout_seconds=60.0", "schedule.warmup_steps=0", "train.steps=2"});
  net::Context context;
  const net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};
  std::vector<Identity> ids = {Identity::generate(), Identity::generate(), Identity::generate()};
  std::vector<std::unique_ptr<Client>> clients;
  std::string run_id;
  for (size_t i = 0; i < ids.size(); ++i) {
    clients.push_back(
        std::make_unique<Client>(context, ids[i], endpoint, identity_.public_key(), control));
    clients[i]->send(join_msg(ids[i], 7700 + static_cast<int>(i)));
    const auto welcome =
        wait_for(*clients[i], 10, [](const wire::Envelope& m) { return m.has_welcome(); });
    ASSERT_TRUE(welcome.has_value());
    run_id = welcome->welcome().run_id();
  }
  for (auto& client : clients) {
    ASSERT_TRUE(wait_for(*client, 10, [](const wire::Envelope& m) {
      return m.has_round_start() && m.round_start().step() == 0;
    }));
  }
  const auto commit = [&](size_t i, const std::string& hash, double loss) {
    wire::Envelope e;
    wire::CommitRecord* r = e.mutable_commit()->mutable_record();
    r->set_author(ids[i].public_key());
    r->set_step(0);
    r->set_payload_hash(hash);
    r->set_signature(ids[i].sign(net::commit_signing_bytes(run_id, 0, hash)));
    e.mutable_commit()->set_sequences(4);
    e.mutable_commit()->set_compute_seconds(1.0);
    e.mutable_commit()->set_loss(loss);
    e.mutable_commit()->set_payload_bytes(100);
    clients[i]->send(e);
  };
  const std::vector<std::string> hashes = {std::string(32, 'a'), std::string(32, 'b'),
                                           std::string(32, 'c')};
  commit(0, hashes[0], 1.0);
  commit(1, hashes[1], 2.0);
  commit(1, std::string(32, 'x'), 1000.0);  // a second, different commit: rejected
  commit(2, hashes[2], 100.0);              // one member's outlandish claim
  for (auto& client : clients) {
    ASSERT_TRUE(wait_for(*client, 10, [](const wire::Envelope& m) { return m.has_collect(); }));
    wire::Envelope w;
    w.mutable_witness()->set_step(0);
    for (const std::string& h : hashes) w.mutable_witness()->add_held(h);
    client->send(w);
  }
  ASSERT_TRUE(wait_for(*clients[0], 10, [](const wire::Envelope& m) {
    return m.has_finalized() && m.finalized().step() == 0;
  }));
  stop_ = true;
  coordinator_.join();
  const auto rows = Store::open(dir_ / "coordinator.db").step_rows();
  ASSERT_GE(rows.size(), 1u);
  EXPECT_EQ(rows[0].peers, 3u);
  EXPECT_DOUBLE_EQ(rows[0].loss, 2.0);
}

}  // namespace
}  // namespace agora::coord
