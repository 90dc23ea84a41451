// A whole peer driven by fake network events, in one process: the round logic (join, sync,
// apply, train, commit) without sockets. FakeRun plays the coordinator and the network behind
// PeerLink: it answers Join with a Welcome, finalizes each commit at once and opens the next
// round with apply_through = that step + 1 (overlap 0), and finishes the run after `steps`.
//
// With one member, that schedule is exactly the local trainer's (train, apply own payload,
// train...), so the peer must end with the trainer's parameters, bit for bit, and commit the
// trainer's losses: the step function is shared, and this test fails if the two drift.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "../unit/test_support.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/net/identity.h"
#include "agora/obs/metrics.h"
#include "agora/peer/peer.h"
#include "agora/peer/peer_link.h"
#include "agora/peer/peer_metrics.h"
#include "agora/train/checkpoint.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/trainer.h"

namespace agora::peer {
namespace {
namespace fs = std::filesystem;

const std::string kData = AGORA_DATA_DIR "/tokens/sp8k";

class FakeRun : public PeerLink {
 public:
  FakeRun(std::string config_toml, uint64_t steps, uint64_t batch)
      : toml_(std::move(config_toml)), steps_(steps), batch_(batch) {}

  // Hooks a test sets to change the script.
  std::function<void(const wire::Commit&)> on_commit;  // replaces the default reaction
  std::function<void(const wire::Join&)> on_join;      // replaces the Welcome and round 0
  std::function<void(const wire::GetFinalized&)> on_get_finalized;  // else unanswered
  bool check_commits = true;

  const std::string& endpoint() const override { return endpoint_; }
  net::BlobStore& blobs() override { return blobs_; }
  void configure(LinkSettings settings) override {
    run_id_ = std::move(settings.run_id);
    validator_ = std::move(settings.validator);
  }
  void send_to_coordinator(wire::Envelope m) override {
    sent.push_back(m);
    if (m.has_join()) {
      member_.set_key(m.join().key());
      member_.set_endpoint(m.join().endpoint());
      if (on_join) return on_join(m.join());
      push(welcome(0));
      push(round_start(0));
    } else if (m.has_commit()) {
      // What a member's witness check does with a payload it fetched (check_commits): the
      // peer's validator decodes it, and keeps it for apply().
      const wire::CommitRecord& r = m.commit().record();
      if (check_commits && validator_) {
        if (auto bytes = blobs_.get(r.payload_hash()))
          validator_(r.payload_hash(), *bytes, r.step());
      }
      if (on_commit) return on_commit(m.commit());
      finalize(m.commit().record());
    } else if (m.has_get_finalized() && on_get_finalized) {
      on_get_finalized(m.get_finalized());
    }
  }
  std::optional<wire::Envelope> next_from_coordinator(double) override {
    if (inbox_.empty() && busy_messages > 0) {
      // A run whose messages never pause: one more Collect of a step this peer has no part in.
      if (--busy_messages == 0) {
        applied_when_finished = status_applied;
        wire::Envelope done;
        done.mutable_finished()->set_steps(finish_steps);
        return done;
      }
      wire::Envelope c;
      c.mutable_collect()->set_step(1000);
      return c;
    }
    if (inbox_.empty()) return std::nullopt;
    wire::Envelope m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }
  void set_status(uint64_t applied, uint64_t) override { status_applied = applied; }
  void collect(uint64_t, std::vector<wire::CommitRecord>, std::vector<wire::Member>,
               bool) override {}
  std::vector<std::string> ensure(uint64_t, const std::vector<wire::CommitRecord>& set,
                                  std::vector<wire::Member>, double) override {
    std::vector<std::string> missing;
    for (const auto& r : set) {
      if (!blobs_.contains(r.payload_hash())) missing.push_back(r.payload_hash());
    }
    return missing;
  }
  void publish_snapshot(uint64_t applied, std::shared_ptr<const Snapshot>) override {
    published.push_back(applied);
  }
  Snapshot fetch_state(const wire::StateRecord&, const std::vector<wire::Member>&,
                       double) override {
    fail("this test's run has nobody to fetch a state from");
  }
  NetworkCounters counters() const override { return {}; }

  void push(wire::Envelope m) { inbox_.push_back(std::move(m)); }
  // `finalized_steps` steps are final; the state handed over is step 0's (the seed's).
  wire::Envelope welcome(uint64_t finalized_steps) const {
    wire::Envelope w;
    auto* welcome = w.mutable_welcome();
    welcome->set_run_id("fake-run");
    welcome->set_run_config_toml(toml_);
    welcome->set_finalized_steps(finalized_steps);
    welcome->mutable_state()->set_applied_steps(0);
    *welcome->add_holders() = member_;
    welcome->set_checkpointer(checkpointer);
    return w;
  }
  // The run is over after `steps`; released at once (no linger).
  static wire::Envelope finished(uint64_t steps) {
    wire::Envelope e;
    e.mutable_finished()->set_steps(steps);
    return e;
  }
  size_t joins() const {
    return static_cast<size_t>(
        std::count_if(sent.begin(), sent.end(), [](const auto& m) { return m.has_join(); }));
  }
  wire::Envelope round_start(uint64_t step) const {
    wire::Envelope e;
    auto* r = e.mutable_round_start();
    r->set_step(step);
    r->set_apply_through(step);  // everything before it is final and applied by now
    auto* range = r->add_assignment();
    range->set_first(step * batch_);
    range->set_count(batch_);
    *r->add_members() = member_;
    r->set_checkpointer(checkpointer);  // as a coordinator says who holds the role each round
    return e;
  }
  // Step `record.step()` is final with this one payload; the next round, or the end.
  void finalize(const wire::CommitRecord& record) {
    wire::Envelope f;
    f.mutable_finalized()->set_step(record.step());
    *f.mutable_finalized()->add_set() = record;
    push(f);
    if (record.step() + 1 < steps_) {
      push(round_start(record.step() + 1));
    } else {
      wire::Envelope done;
      done.mutable_finished()->set_steps(steps_);
      done.mutable_finished()->set_checkpointer(checkpointer);
      push(done);
    }
  }
  std::vector<wire::Commit> commits() const {
    std::vector<wire::Commit> out;
    for (const auto& m : sent) {
      if (m.has_commit()) out.push_back(m.commit());
    }
    return out;
  }

  std::vector<wire::Envelope> sent;
  std::vector<uint64_t> published;
  // When set: after the inbox empties, this many messages without a pause, the last Finished.
  int busy_messages = 0;
  uint64_t finish_steps = 0;
  bool checkpointer = false;  // what the Welcome, RoundStart and Finished make the peer
  std::optional<uint64_t> applied_when_finished;
  uint64_t status_applied = 0;
  std::string run_id_;
  PayloadValidator validator_;

 private:
  std::string toml_;
  uint64_t steps_, batch_;
  std::string endpoint_ = "tcp://127.0.0.1:1";
  net::BlobStore blobs_;
  wire::Member member_;
  std::deque<wire::Envelope> inbox_;
};

// Stops the peer if it has not returned within `seconds`: a test of a peer that must not hang
// fails rather than hanging with it.
class Watchdog {
 public:
  Watchdog(std::atomic<bool>& stop, double seconds)
      : thread_([this, &stop, seconds] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                                 [this] { return done_; })) {
            fired_ = true;
            stop = true;
          }
        }) {}
  ~Watchdog() { disarm(); }
  // True when the watchdog had to stop the peer. Call after the peer returned.
  bool disarm() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

class PeerRoundTest : public agora::testing::TempDirTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kData + "/meta.json"))
        << kData << " is missing: run 'make data' (make test does it)";
    TempDirTest::SetUp();
  }

  std::string config_toml(int64_t steps) const {
    return fmt::format(R"(
seed = 5
[model]
preset = "tiny"
[data]
dir = "{}"
seq_len = 32
[train]
steps = {}
batch_size = {}
micro_batch_size = 4
eval_interval = 0
checkpoint_interval = 0
out_dir = "{}"
device = "cpu"
threads = 1
[schedule]
kind = "constant"
warmup_steps = 1
[optimizer]
name = "demo"
lr = 1e-2
[demo]
topk = 8
one_bit = true
[network]
hash_interval = 1
)",
                       kData, steps, kBatch, (dir_ / "trainer").string());
  }

  PeerSummary run(FakeRun& link, const std::atomic<bool>& stop) {
    PeerOptions options;
    options.data = kData;
    options.checkpoint_dir = dir_ / "peer";
    options.progress = false;
    obs::Registry registry;
    PeerMetrics metrics(registry);
    return run_peer(identity_, options, link, metrics, stop);
  }

  static constexpr uint64_t kBatch = 12;  // 3 micro-batches of 4: a non-power-of-two split
  const net::Identity identity_ = net::Identity::from_seed(std::string(32, 'p'));
};

TEST_F(PeerRoundTest, OnePeerTrainsExactlyAsTheLocalTrainer) {
  constexpr int64_t kSteps = 4;
  FakeRun link(config_toml(kSteps), kSteps, kBatch);
  const std::atomic<bool> stop{false};
  const PeerSummary peer = run(link, stop);

  std::vector<double> losses;
  TrainOptions options;
  options.progress = false;
  options.on_step = [&](const StepStats& s) { losses.push_back(s.loss); };
  const TrainSummary local = train(RunConfig::parse(config_toml(kSteps), "test"), options);

  EXPECT_EQ(peer.applied_steps, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(peer.rounds_trained, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(peer.state_hash, local.parameter_hash);
  const std::vector<wire::Commit> commits = link.commits();
  ASSERT_EQ(commits.size(), static_cast<size_t>(kSteps));
  for (size_t s = 0; s < commits.size(); ++s) {
    const wire::Commit& c = commits[s];
    EXPECT_EQ(c.record().step(), s);
    EXPECT_EQ(c.loss(), losses[s]) << "step " << s;  // the same bits, not merely close
    EXPECT_EQ(c.sequences(), kBatch);
    const std::optional<std::string> payload = link.blobs().get(c.record().payload_hash());
    ASSERT_TRUE(payload.has_value());
    EXPECT_EQ(blake2b256_bytes(*payload), c.record().payload_hash());
    EXPECT_EQ(c.payload_bytes(), payload->size());
    EXPECT_TRUE(net::verify_signature(
        c.record().author(), net::commit_signing_bytes("fake-run", s, c.record().payload_hash()),
        c.record().signature()));
    ASSERT_TRUE(link.validator_);
    // The same bytes under a commitment for another step (a replay) are refused.
    EXPECT_TRUE(link.validator_(c.record().payload_hash(), *payload, s + 1).has_value());
  }
  EXPECT_TRUE(link.validator_(blake2b256_bytes("not a payload"), "not a payload", 0).has_value());
  // Every payload passed the witness check when it was committed (FakeRun's check_commits), and
  // apply() took each decoded from it: the peer's store, which its strategy (made again when the
  // peer loaded the state) shares, is empty at the end.
  EXPECT_EQ(peer.payloads_predecoded, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(peer.decoded_payloads_kept, 0u);
  // A state report after every applied step (hash_interval = 1), and one after the initial sync.
  EXPECT_EQ(link.published, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(link.status_applied, static_cast<uint64_t>(kSteps));
}

TEST_F(PeerRoundTest, ARoundAnnouncedAgainIsCommittedAgainNotRetrained) {
  FakeRun link(config_toml(2), 2, kBatch);
  bool repeated = false;
  link.on_commit = [&](const wire::Commit& c) {
    if (!repeated) {
      repeated = true;
      link.push(link.round_start(c.record().step()));  // as after a coordinator restart
      return;
    }
    link.finalize(c.record());
  };
  const std::atomic<bool> stop{false};
  const PeerSummary peer = run(link, stop);
  const std::vector<wire::Commit> commits = link.commits();
  ASSERT_EQ(commits.size(), 3u);  // step 0 twice (the same message), step 1 once
  EXPECT_EQ(commits[0].SerializeAsString(), commits[1].SerializeAsString());
  EXPECT_EQ(commits[2].record().step(), 1u);
  EXPECT_EQ(peer.rounds_trained, 2u);
}

TEST_F(PeerRoundTest, AFinalizedPayloadNobodyHoldsStopsThePeerWithAClearError) {
  FakeRun link(config_toml(3), 3, kBatch);
  link.on_commit = [&](const wire::Commit& c) {
    wire::CommitRecord lost = c.record();
    lost.set_payload_hash(std::string(32, 'x'));  // final, but no member can serve it
    link.finalize(lost);
  };
  const std::atomic<bool> stop{false};
  try {
    run(link, stop);
    FAIL() << "the peer applied a step without its payload";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not be fetched"), std::string::npos) << e.what();
    // It was applying the finalized steps before round 1 when it found out.
    EXPECT_NE(std::string(e.what()).find("(while catching_up)"), std::string::npos) << e.what();
  }
}

TEST_F(PeerRoundTest, FinalizedStepsAreAppliedWhileMessagesKeepComing) {
  // A syncing member gets a Finalized per step and nothing else. When steps come faster than any
  // pause, it must still apply them as they come: waiting for a quiet moment let the run prune
  // the payloads before the member asked for them.
  FakeRun link(config_toml(3), 3, kBatch);
  link.on_commit = [&](const wire::Commit& c) {
    wire::Envelope f;
    f.mutable_finalized()->set_step(c.record().step());
    *f.mutable_finalized()->add_set() = c.record();
    link.push(f);
    link.busy_messages = 50;
    link.finish_steps = 1;
  };
  const std::atomic<bool> stop{false};
  const PeerSummary peer = run(link, stop);
  EXPECT_EQ(peer.applied_steps, 1u);
  ASSERT_TRUE(link.applied_when_finished.has_value());
  EXPECT_EQ(*link.applied_when_finished, 1u) << "step 0 waited for a pause in the messages";
}

// A folder named like the checkpoint a checkpointer writes, left by an earlier run, holds other
// parameters: it is replaced, so what the peer reports (its hash) is what the folder holds.
TEST_F(PeerRoundTest, ACheckpointerReplacesAStaleFolderOfTheSameName) {
  FakeRun link(config_toml(2), 2, kBatch);
  link.checkpointer = true;
  const fs::path stale = dir_ / "peer" / "checkpoint_000002";
  fs::create_directories(stale);
  write_file_atomic(stale / "agora.json", "{\"step\": 2, \"stale\": true}\n");
  const std::atomic<bool> stop{false};
  const PeerSummary peer = run(link, stop);
  ASSERT_EQ(peer.applied_steps, 2u);
  std::string reported;
  for (const wire::Envelope& m : link.sent) {
    if (m.has_checkpoint_report() && m.checkpoint_report().applied_steps() == 2) {
      reported = hex_encode(m.checkpoint_report().state_hash());
    }
  }
  EXPECT_EQ(reported, peer.state_hash);
  Llama written = load_checkpoint(stale, torch::kCPU).model;
  EXPECT_EQ(parameter_hash(written), reported) << "the folder holds what was reported";
}

TEST_F(PeerRoundTest, AStoppedPeerSendsLeave) {
  FakeRun link(config_toml(3), 3, kBatch);
  std::atomic<bool> stop{false};
  link.on_commit = [&](const wire::Commit&) { stop = true; };
  const PeerSummary peer = run(link, stop);
  EXPECT_EQ(peer.rounds_trained, 1u);
  ASSERT_FALSE(link.sent.empty());
  EXPECT_TRUE(link.sent.back().has_leave());
}

// A peer the coordinator dropped while it was catching up (paused or cut off past the heartbeat
// timeout) hears "join again" in answer to GetFinalized: it joins again and finishes the run,
// rather than asking for the set forever.
TEST_F(PeerRoundTest, ARefusalWhileCatchingUpMakesThePeerJoinAgain) {
  FakeRun link(config_toml(2), 2, kBatch);
  link.on_join = [&](const wire::Join&) {
    link.push(link.welcome(2));  // ahead of the state (step 0): two steps to catch up on
    if (link.joins() < 2) return;
    for (uint64_t step = 0; step < 2; ++step) {
      wire::Envelope f;
      f.mutable_finalized()->set_step(step);  // nobody's payload: nothing to fetch
      link.push(f);
    }
    link.push(FakeRun::finished(2));
  };
  int asks = 0;
  link.on_get_finalized = [&](const wire::GetFinalized&) {
    if (link.joins() > 1) return;  // the sets are on their way already
    // A round opened meanwhile: acting on it, the peer asks again and is refused again. The
    // second refusal answered a message from before the rejoin: it must not cause a third Join.
    if (++asks == 1) link.push(link.round_start(2));
    wire::Envelope refused;
    refused.mutable_refused()->set_reason("dropped from run fake-run: silent; join again");
    refused.mutable_refused()->set_may_rejoin(true);
    link.push(refused);
  };
  std::atomic<bool> stop{false};
  Watchdog watchdog(stop, 10);
  const PeerSummary peer = run(link, stop);
  EXPECT_FALSE(watchdog.disarm()) << "the peer was still catching up after 10 s";
  EXPECT_EQ(asks, 2);
  EXPECT_EQ(link.joins(), 2u);
  EXPECT_EQ(peer.applied_steps, 2u);
  EXPECT_EQ(peer.rounds_trained, 0u);
  EXPECT_FALSE(link.sent.back().has_leave()) << "it left rather than finishing";
}

// A coordinator whose run is over (and that does not count this peer as a member) answers every
// GetFinalized with Finished: the peer finishes with the steps it has, at once.
TEST_F(PeerRoundTest, AFinishedRunWhileCatchingUpEndsThePeerPromptly) {
  FakeRun link(config_toml(2), 2, kBatch);
  link.on_join = [&](const wire::Join&) { link.push(link.welcome(2)); };
  link.on_get_finalized = [&](const wire::GetFinalized&) { link.push(FakeRun::finished(2)); };
  std::atomic<bool> stop{false};
  Watchdog watchdog(stop, 10);
  const auto started = std::chrono::steady_clock::now();
  const PeerSummary peer = run(link, stop);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_FALSE(watchdog.disarm()) << "the peer was still catching up after 10 s";
  // Sooner than GetFinalized is asked again (5 s): the Finished was acted on, not waited out.
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(link.joins(), 1u);
  EXPECT_EQ(peer.applied_steps, 0u);
  EXPECT_FALSE(link.sent.back().has_leave()) << "it left rather than finishing";
}

}  // namespace
}  // namespace agora::peer
