// swarm/coordinator_server.h over real CURVE sockets: hostile and confused clients are refused
// with a reason, a flood is cut by the rate bound, honest replicas are answered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "agora/config/run_config.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/optim/payload.h"
#include "agora/serve/members.h"
#include "agora/swarm/contribution_check.h"
#include "agora/swarm/coordinator_server.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

struct Client {
  net::Context context;
  net::Identity identity;
  net::Client client;
  Client(const std::string& endpoint, const net::PublicKey& server, uint8_t seed)
      : identity(net::Identity::from_seed(std::string(32, static_cast<char>(seed)))),
        client(context, identity, endpoint, server, net::DecodeLimits{}) {}

  // The next answer: a view, or the one refusal (serve/members.h) of a non-member.
  std::optional<wire::Envelope> answer(double seconds = 10) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      zmq::pollitem_t item{client.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      while (auto m = client.recv()) {
        if (m->has_swarm_view() || m->has_refused()) return m;
      }
    }
    return std::nullopt;
  }
  std::optional<wire::SwarmView> view(double seconds = 10) {
    auto m = answer(seconds);
    if (!m || !m->has_swarm_view()) return std::nullopt;
    return m->swarm_view();
  }
  wire::SwarmView hello(const std::string& key, const std::string& fingerprint, int stage,
                        const std::string& endpoint = "tcp://127.0.0.1:1") {
    wire::Envelope e;
    auto* h = e.mutable_swarm_hello();
    h->set_key(key);
    h->set_endpoint(endpoint);
    h->set_stage(stage);
    h->set_fingerprint(fingerprint);
    client.send(e);
    auto v = view();
    EXPECT_TRUE(v.has_value());
    return v.value_or(wire::SwarmView{});
  }
  void poll(int done = 0) {
    wire::Envelope e;
    auto* p = e.mutable_swarm_poll();
    p->set_stage(0);
    for (int i = 0; i < done; ++i) p->add_done()->set_micro_batch(static_cast<uint32_t>(i));
    client.send(e);
  }
};

class SwarmServer : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("agora_swarm_server_" + std::to_string(getpid()));
    fs::remove_all(root_);
    options_.listen = "tcp://127.0.0.1:*";
    options_.fingerprint = std::string(32, 'F');
    options_.schedule.stages = 2;
    options_.schedule.steps = 5;
    options_.schedule.micro_batches = 4;
    options_.schedule.start_peers = 2;
    options_.messages_per_second = 50;
    options_.burst = 100;
    options_.out = root_;
    options_.progress = false;
    options_.stop = &stop_;
    thread_ = std::thread([this] { summary_ = serve_swarm(server_id_, options_); });
    for (int i = 0; i < 500 && endpoint_.empty(); ++i) {
      std::ifstream events(root_ / "events.jsonl");
      std::string line;
      if (std::getline(events, line)) {
        endpoint_ = nlohmann::json::parse(line)["listen"].get<std::string>();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_FALSE(endpoint_.empty());
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    fs::remove_all(root_);
  }

  fs::path root_;
  net::Identity server_id_ = net::Identity::from_seed(std::string(32, '\x01'));
  SwarmServerOptions options_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::string endpoint_;
  nlohmann::json summary_;
};

TEST_F(SwarmServer, RefusesHellosThatLieAndPollsBeforeAHello) {
  Client a(endpoint_, server_id_.public_key(), 2);
  Client b(endpoint_, server_id_.public_key(), 3);
  // Another member's key: the connection proved a's.
  EXPECT_NE(a.hello(b.identity.public_key(), options_.fingerprint, 0)
                .refused()
                .find("not the key this connection authenticated"),
            std::string::npos);
  // Another run config.
  EXPECT_NE(a.hello(a.identity.public_key(), std::string(32, 'X'), 0)
                .refused()
                .find("another run config"),
            std::string::npos);
  // A stage the run does not have, an endpoint nobody can dial.
  EXPECT_NE(a.hello(a.identity.public_key(), options_.fingerprint, 5)
                .refused()
                .find("stage 5 does not exist"),
            std::string::npos);
  EXPECT_NE(a.hello(a.identity.public_key(), options_.fingerprint, 0, "ipc:///x")
                .refused()
                .find("tcp://"),
            std::string::npos);
  // A poll from a key that never said hello.
  b.poll();
  auto refused = b.answer();
  ASSERT_TRUE(refused.has_value() && refused->has_refused());
  EXPECT_EQ(refused->refused().reason(), serve::kNotAMember);
  EXPECT_TRUE(refused->refused().may_rejoin());
  // And an honest hello is answered with its stage; the run waits for its second peer.
  const wire::SwarmView ok = a.hello(a.identity.public_key(), options_.fingerprint, 1);
  EXPECT_TRUE(ok.refused().empty());
  EXPECT_EQ(ok.stage(), 1u);
  EXPECT_EQ(ok.stages(), 2u);
  EXPECT_EQ(ok.phase(), "waiting");
}

TEST_F(SwarmServer, AFloodIsCutByTheRateBoundAndTheServerStillAnswers) {
  Client a(endpoint_, server_id_.public_key(), 4);
  ASSERT_TRUE(a.hello(a.identity.public_key(), options_.fingerprint, 0).refused().empty());
  // 2,000 polls at once, each claiming 10,000 micro-batches done: most are dropped unanswered,
  // none counts (nothing was handed out), and the server goes on.
  for (int i = 0; i < 2000; ++i) a.poll(i == 0 ? 10000 : 0);
  int answered = 0;
  while (a.view(1.0)) ++answered;
  EXPECT_GT(answered, 0);
  EXPECT_LT(answered, 400);  // burst 100 + 50/s while the flood lasts
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  a.poll();
  EXPECT_TRUE(a.view().has_value());
  stop_ = true;
  thread_.join();
  EXPECT_EQ(summary_["samples_done"], 0);
  EXPECT_EQ(summary_["steps"], 0);
}

// Issue 38, finding 6: contributions were kept and relayed unchecked (up to 12 bytes per
// parameter of the largest stage), so one oversized contribution pushed every view of its
// stage past the replicas' limit. The coordinator now takes only a DeMo payload of the stage's
// exact layout, for the round's step.
TEST(SwarmContributionCheck, TakesOnlyTheStagesPayloadForTheStep) {
  const RunConfig run = RunConfig::parse(R"(
[model]
preset = "tiny"
vocab_size = 512
num_layers = 3
tie_embeddings = false
[data]
seq_len = 16
[train]
batch_size = 8
micro_batch_size = 2
[demo]
topk = 4
chunk = 16
[pipeline]
stages = 3
)",
                                         "test");
  const std::vector<PayloadLayout> layouts = swarm_contribution_layouts(run);
  ASSERT_EQ(layouts.size(), 3u);
  const auto check = contribution_checker(layouts);
  for (int64_t stage = 0; stage < 3; ++stage) {
    Payload p;
    p.step = 7;
    for (const TensorLayout& l : layouts[static_cast<size_t>(stage)].tensors) {
      TensorPayload t;
      t.layout = l;
      for (int64_t c = 0; c < l.num_chunks(); ++c) {
        for (int64_t k = 0; k < l.topk; ++k) t.positions.push_back(static_cast<uint32_t>(k));
      }
      t.values.assign(static_cast<size_t>(l.value_count()), 0.5f);
      p.tensors.push_back(std::move(t));
    }
    const std::string bytes = encode_payload(p);
    EXPECT_EQ(check(stage, 7, bytes), "") << "stage " << stage;
    EXPECT_NE(check(stage, 8, bytes).find("step 7"), std::string::npos);
    const int64_t other = (stage + 1) % 3;
    EXPECT_NE(check(other, 7, bytes), "") << "stage " << stage << "'s payload as " << other << "'s";
    EXPECT_NE(check(stage, 7, bytes + std::string(1 << 20, 'x')).find("bytes"), std::string::npos);
    std::string garbled = bytes;
    garbled[0] ^= 0x5a;
    EXPECT_NE(check(stage, 7, garbled), "");
  }
  EXPECT_NE(check(3, 0, ""), "");
}

}  // namespace
}  // namespace agora
