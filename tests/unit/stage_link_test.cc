// The stage link's start handshake and its defences against a neighbour that lies or floods
// (peer/stage_link.h), over real CURVE sockets on loopback.
#include "agora/peer/stage_link.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "agora/core/error.h"
#include "test_support.h"

namespace agora::peer {
namespace {

const std::string kRun(32, 'r');

struct Stage {
  net::Identity identity = net::Identity::generate();
  std::unique_ptr<StageLink> link;
};

// S stages on loopback, built last first (each connects to the next's bound endpoint).
std::vector<Stage> chain(int64_t stages, double timeout = 10, int64_t max_waiting = 8) {
  std::vector<Stage> out(static_cast<size_t>(stages));
  std::string next;
  for (int64_t i = stages - 1; i >= 0; --i) {
    StageLinkOptions o;
    o.stage = i;
    o.stages = stages;
    o.timeout_seconds = o.start_timeout_seconds = timeout;
    o.max_waiting = max_waiting;
    if (i > 0) o.listen = "tcp://127.0.0.1:*";
    if (i < stages - 1) {
      o.next = next;
      o.next_key = out[static_cast<size_t>(i + 1)].identity.public_key();
    }
    out[static_cast<size_t>(i)].link =
        std::make_unique<StageLink>(out[static_cast<size_t>(i)].identity, o);
    next = out[static_cast<size_t>(i)].link->endpoint();
  }
  return out;
}

// Runs every stage's start() at once; returns what each returned or the error it threw.
std::vector<std::string> start_all(std::vector<Stage>& stages,
                                   const std::vector<std::string>& fingerprints,
                                   const std::vector<std::vector<uint64_t>>& held) {
  std::vector<std::future<std::string>> runs;
  for (size_t i = 0; i < stages.size(); ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      try {
        return std::to_string(stages[i].link->start(fingerprints[i], held[i]));
      } catch (const Error& e) {
        stages[i].link->tell_failure(e.what());
        return std::string("error: ") + e.what();
      }
    }));
  }
  std::vector<std::string> out;
  for (auto& r : runs) out.push_back(r.get());
  return out;
}

TEST(StageLink, StartsAtTheNewestStepEveryStageHolds) {
  auto stages = chain(3);
  const auto started = start_all(stages, {kRun, kRun, kRun}, {{4, 8}, {8, 12}, {4, 8, 12}});
  EXPECT_EQ(started, (std::vector<std::string>{"8", "8", "8"}));
}

TEST(StageLink, StartsFromTheBeginningWithoutACommonCheckpoint) {
  auto stages = chain(3);
  EXPECT_EQ(start_all(stages, {kRun, kRun, kRun}, {{4}, {}, {4}}),
            (std::vector<std::string>{"0", "0", "0"}));
}

TEST(StageLink, BoundaryMessagesFlowAfterTheStart) {
  auto stages = chain(2);
  ASSERT_EQ(start_all(stages, {kRun, kRun}, {{}, {}}), (std::vector<std::string>{"0", "0"}));
  BoundaryHeader h;
  h.stage = 0;
  h.rows = 1;
  h.width = 2;
  const std::vector<float> values = {1, 2};
  for (uint64_t step : {1, 0}) {  // out of order: await() hands them out in the asked order
    h.step = step;
    stages[0].link->send_forward(encode_boundary(h, values, {}));
  }
  for (int64_t step : {0, 1}) {
    const BoundaryMessage m =
        decode_boundary(stages[1].link->await(BoundaryDirection::kForward, step, 0));
    EXPECT_EQ(m.header.step, static_cast<uint64_t>(step));
  }
  h.direction = BoundaryDirection::kBackward;
  h.stage = 1;
  h.step = 0;
  stages[1].link->send_backward(encode_boundary(h, values, {}));
  EXPECT_EQ(decode_boundary(stages[0].link->await(BoundaryDirection::kBackward, 0, 0)).header.stage,
            1u);
}

TEST(StageLink, AnotherConfigurationIsNamedAndBlamed) {
  auto stages = chain(3);
  const auto started =
      start_all(stages, {kRun, std::string(32, 'x'), std::string(32, 'x')}, {{}, {}, {}});
  EXPECT_NE(started[1].find("stage 1: stage 0 runs another configuration"), std::string::npos)
      << started[1];
  EXPECT_EQ(stages[1].link->blamed(), 0);
  // The others stop at once, naming the stage that failed first.
  EXPECT_NE(started[0].find("stopping because stage 0 stopped"), std::string::npos) << started[0];
  EXPECT_NE(started[2].find("stopping because stage 0 stopped"), std::string::npos) << started[2];
}

// A hostile previous stage: raw Envelopes into stage 1 of 2.
class HostilePrevious : public ::testing::Test {
 protected:
  HostilePrevious() {
    StageLinkOptions o;
    o.stage = 1;
    o.stages = 2;
    o.listen = "tcp://127.0.0.1:*";
    o.timeout_seconds = o.start_timeout_seconds = 5;
    o.max_waiting = 4;
    link_ = std::make_unique<StageLink>(identity_, o);
    client_.emplace(context_, net::Identity::generate(), link_->endpoint(), identity_.public_key(),
                    net::DecodeLimits{});
  }

  void send_hello(int steps) {
    wire::Envelope e;
    e.mutable_stage_data()->set_stage(0);
    wire::StageHello* hello = e.mutable_stage_data()->mutable_hello();
    hello->set_fingerprint(kRun);
    for (int s = 0; s < steps; ++s) hello->add_steps(static_cast<uint64_t>(s));
    client_->send(e);
  }
  void send_boundary(uint64_t step) {
    BoundaryHeader h;
    h.step = step;
    h.rows = 1;
    h.width = 1;
    const std::vector<float> v = {1};
    wire::Envelope e;
    e.mutable_stage_data()->set_stage(0);
    e.mutable_stage_data()->set_boundary(encode_boundary(h, v, {}));
    client_->send(e);
  }

  net::Identity identity_ = net::Identity::generate();
  std::unique_ptr<StageLink> link_;
  net::Context context_;
  std::optional<net::Client> client_;
};

TEST_F(HostilePrevious, ActivationsBeforeTheHello) {
  send_boundary(0);
  EXPECT_ERROR_WITH(link_->start(kRun, {}),
                    "stage 0 sent activations or gradients before the hello");
  EXPECT_EQ(link_->blamed(), 0);
}

TEST_F(HostilePrevious, TwoHellos) {
  send_hello(1);
  send_hello(1);
  EXPECT_ERROR_WITH(
      {
        link_->start(kRun, {});
        link_->await(BoundaryDirection::kForward, 0, 0);
      },
      "stage 0 sent its hello twice");
  EXPECT_EQ(link_->blamed(), 0);
}

TEST_F(HostilePrevious, TooManySteps) {
  send_hello(static_cast<int>(kMaxHelloSteps) + 1);
  EXPECT_ERROR_WITH(link_->start(kRun, {}), "65 steps", "at most 64 steps");
  EXPECT_EQ(link_->blamed(), 0);
}

TEST_F(HostilePrevious, RunningAheadWithoutBound) {
  send_hello(1);
  EXPECT_EQ(link_->start(kRun, {}), 0u);
  for (uint64_t s = 0; s < 6; ++s) send_boundary(s + 10);
  EXPECT_ERROR_WITH(link_->await(BoundaryDirection::kForward, 0, 0),
                    "stage 0 sent more than 4 messages ahead of this stage");
  EXPECT_EQ(link_->blamed(), 0);
}

TEST_F(HostilePrevious, SilenceIsATimeoutNamingTheStage) {
  EXPECT_ERROR_WITH(link_->start(kRun, {}), "stage 1: stage 0 sent nothing for",
                    "while this stage waited for its hello");
  EXPECT_EQ(link_->blamed(), 0);
}

// A neighbour's frame is bounded by the largest boundary the run's shapes allow
// (max_boundary_bytes), not by the transport's 1 GiB: a larger one is dropped unread, and the
// boundary that follows it is the one that arrives.
TEST(StageLinkLimits, AFrameAboveTheLargestBoundaryIsDroppedUnread) {
  const net::Identity identity = net::Identity::generate();
  StageLinkOptions o;
  o.stage = 1;
  o.stages = 2;
  o.listen = "tcp://127.0.0.1:*";
  o.timeout_seconds = o.start_timeout_seconds = 5;
  o.max_boundary_bytes = 64 << 10;
  StageLink link(identity, o);
  net::Context context;
  net::Client client(context, net::Identity::generate(), link.endpoint(), identity.public_key(),
                     net::DecodeLimits{});
  const auto boundary = [](size_t width) {
    BoundaryHeader h;
    h.step = 0;
    h.rows = 1;
    h.width = static_cast<uint32_t>(width);
    return encode_boundary(h, std::vector<float>(width, 1.0f), {});
  };
  const auto send = [&](const std::string& bytes) {
    wire::Envelope e;
    e.mutable_stage_data()->set_stage(0);
    e.mutable_stage_data()->set_boundary(bytes);
    client.send(e);
  };
  wire::Envelope hello;
  hello.mutable_stage_data()->set_stage(0);
  hello.mutable_stage_data()->mutable_hello()->set_fingerprint(kRun);
  hello.mutable_stage_data()->mutable_hello()->add_steps(0);
  client.send(hello);
  ASSERT_EQ(link.start(kRun, {}), 0u);
  send(boundary(64 << 10));  // 256 KiB of activations: above the bound, below the control limit
  const std::string small = boundary(16);
  send(small);
  EXPECT_EQ(link.await(BoundaryDirection::kForward, 0, 0), small);
}

// Outsiders who complete the CURVE handshake with stage 1 (they know its endpoint and key).
wire::Envelope stop_message() {
  wire::Envelope e;
  e.mutable_stage_data()->set_stage(0);
  e.mutable_stage_data()->set_error("stop, says an outsider");
  return e;
}

TEST(StageLinkAdmission, OnlyTheNamedPreviousStageIsHeard) {
  const net::Identity me = net::Identity::generate(), previous = net::Identity::generate();
  StageLinkOptions o;
  o.stage = 1;
  o.stages = 2;
  o.listen = "tcp://127.0.0.1:*";
  o.timeout_seconds = o.start_timeout_seconds = 5;
  o.prev_key = previous.public_key();
  StageLink link(me, o);
  net::Context context;
  net::Client outsider(context, net::Identity::generate(), link.endpoint(), me.public_key(), {});
  outsider.send(stop_message());  // first to speak, and still not heard
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  net::Client real(context, previous, link.endpoint(), me.public_key(), {});
  wire::Envelope hello;
  hello.mutable_stage_data()->mutable_hello()->set_fingerprint(kRun);
  real.send(hello);
  EXPECT_EQ(link.start(kRun, {}), 0u);
  // Issue 38, finding 8: the outsider's handshake is refused, so its frame is never received
  // (it was received, decoded and dropped: ignored() was 1).
  EXPECT_EQ(link.ignored(), 0u);
  EXPECT_GE(link.refused_handshakes(), 1u);
}

TEST(StageLinkAdmission, WithoutAKeyTheFirstToSpeakIsThePreviousStage) {
  const net::Identity me = net::Identity::generate();
  StageLinkOptions o;
  o.stage = 1;
  o.stages = 2;
  o.listen = "tcp://127.0.0.1:*";
  o.timeout_seconds = o.start_timeout_seconds = 5;
  StageLink link(me, o);
  net::Context context;
  net::Client real(context, net::Identity::generate(), link.endpoint(), me.public_key(), {});
  wire::Envelope hello;
  hello.mutable_stage_data()->mutable_hello()->set_fingerprint(kRun);
  real.send(hello);
  EXPECT_EQ(link.start(kRun, {}), 0u);
  // Later, an outsider tries to stop the stage and to take the route gradients go back on.
  net::Client outsider(context, net::Identity::generate(), link.endpoint(), me.public_key(), {});
  outsider.send(stop_message());
  BoundaryHeader h;
  h.rows = 1;
  h.width = 1;
  const std::vector<float> v = {1};
  wire::Envelope data;
  data.mutable_stage_data()->set_boundary(encode_boundary(h, v, {}));
  outsider.send(data);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  real.send(data);
  EXPECT_NO_THROW(link.await(BoundaryDirection::kForward, 0, 0));
  // Once the previous stage spoke, only its key passes the handshake.
  EXPECT_EQ(link.ignored(), 0u);
  EXPECT_GE(link.refused_handshakes(), 1u);
  // The gradient goes back to the real previous stage.
  h.direction = BoundaryDirection::kBackward;
  h.stage = 1;
  link.send_backward(encode_boundary(h, v, {}));
  std::optional<wire::Envelope> back;
  for (int i = 0; i < 200 && !back; ++i) {
    back = real.recv();
    if (back && back->stage_data().has_hello()) back.reset();  // the start, sent first
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(decode_boundary(back->stage_data().boundary()).header.direction,
            BoundaryDirection::kBackward);
  EXPECT_FALSE(outsider.recv().has_value());
}

// A hostile next stage answers the hello with a start it was never offered.
TEST(StageLink, AStartThatWasNotOfferedIsRefused) {
  const net::Identity next_identity = net::Identity::generate();
  net::Context context;
  net::Server next(context, next_identity, "tcp://127.0.0.1:*", {});
  StageLinkOptions o;
  o.stage = 0;
  o.stages = 2;
  o.next = next.bound_endpoint();
  o.next_key = next_identity.public_key();
  o.timeout_seconds = o.start_timeout_seconds = 5;
  StageLink link(net::Identity::generate(), o);
  std::thread liar([&] {
    for (int i = 0; i < 500; ++i) {
      if (auto in = next.recv()) {
        wire::Envelope e;
        e.mutable_stage_data()->set_stage(1);
        e.mutable_stage_data()->mutable_hello()->set_start(true);
        e.mutable_stage_data()->mutable_hello()->set_start_step(7);
        next.send(in->route, e);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  EXPECT_ERROR_WITH(link.start(kRun, {4, 8}), "stage 1 starts the run at step 7",
                    "offered: 0, 4, 8");
  EXPECT_EQ(link.blamed(), 1);
  liar.join();
}

}  // namespace
}  // namespace agora::peer
