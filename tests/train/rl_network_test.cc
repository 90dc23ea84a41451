// The RL roles over real sockets: the published policy's int8 deltas reproduce the learner's
// copy bit for bit, and a learner (serve_learner) with an honest worker (run_rollout_worker) and
// hand-driven hostile clients meets every attack a worker can make with its messages: a hello
// under someone else's key, a hello with an agent string cut mid-character, a forged signature, a
// rollout for a slot it was not handed, an impossible log-probability, fabricated
// log-probabilities until it is banned, and a flood.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/net/curve_socket.h"
#include "agora/optim/payload.h"
#include "agora/rl/learner_server.h"
#include "agora/rl/rollout.h"
#include "agora/rl/rollout_worker.h"
#include "agora/rl/task.h"
#include "agora/train/checkpoint.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/published_policy.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

Llama tiny_model(int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  return Llama(model_preset("tiny", vocab, 64));
}

TEST(PublishedPolicy, DeltasMoveAWorkerToTheLearnersCopyBitForBit) {
  Llama live = tiny_model(300, 1);
  Llama worker = tiny_model(300, 1);  // the same base
  PublishedPolicy published(live);
  ASSERT_EQ(published.state_hash(), hash_parameters(worker).state_hash);
  torch::NoGradGuard no_grad;
  for (uint64_t v = 1; v <= 3; ++v) {
    for (auto& p : live->parameters()) p.add_(torch::randn_like(p) * 0.01);
    const std::string delta = published.advance(live);
    EXPECT_EQ(published.version(), v);
    PublishedPolicy::apply(worker, delta, /*whole=*/false, v);
    EXPECT_EQ(hash_parameters(worker).state_hash, published.state_hash()) << "version " << v;
    // About a byte a parameter: int8 values and a float32 scale per row.
    int64_t numel = 0;
    for (const auto& p : live->parameters()) numel += p.numel();
    EXPECT_LT(delta.size(), static_cast<size_t>(numel) * 13 / 10);
  }
  // The published copy trails the live model by at most half an int8 step per row, and the
  // error does not accumulate: each delta is taken against the published copy.
  const auto live_params = live->named_parameters();
  for (const auto& p : published.model()->named_parameters()) {
    const torch::Tensor gap = (live_params[p.key()] - p.value()).abs().max();
    EXPECT_LT(gap.item<double>(), 0.01) << p.key();
  }
  // A late worker takes the whole policy instead.
  Llama late = tiny_model(300, 7);
  PublishedPolicy::apply(late, published.whole(), /*whole=*/true, 3);
  EXPECT_EQ(hash_parameters(late).state_hash, published.state_hash());
}

TEST(PublishedPolicy, UpdatesThatDoNotFitAreErrors) {
  Llama live = tiny_model(300, 1);
  PublishedPolicy published(live);
  torch::NoGradGuard no_grad;
  for (auto& p : live->parameters()) p.add_(0.01);
  const std::string delta = published.advance(live);
  Llama worker = tiny_model(300, 1);
  EXPECT_THROW(PublishedPolicy::apply(worker, delta, false, 2), Error);  // another version
  EXPECT_THROW(PublishedPolicy::apply(worker, delta, true, 1), Error);   // not a whole policy
  EXPECT_THROW(PublishedPolicy::apply(worker, delta.substr(0, delta.size() - 1), false, 1), Error);
  Llama other = tiny_model(400, 1);  // another vocabulary: another layout
  EXPECT_THROW(PublishedPolicy::apply(other, delta, false, 1), Error);
  // A failed apply left the worker as it was (it is checked before anything is added).
  Llama untouched = tiny_model(300, 1);
  EXPECT_EQ(hash_parameters(worker).state_hash, hash_parameters(untouched).state_hash);
}

// A client that speaks the worker's protocol by hand.
struct Hostile {
  net::Context context;
  net::Identity identity;
  net::Client client;
  Hostile(const std::string& endpoint, const net::PublicKey& learner, uint8_t seed)
      : identity(net::Identity::from_seed(std::string(32, static_cast<char>(seed)))),
        client(context, identity, endpoint, learner, net::DecodeLimits{}) {}

  std::optional<wire::Envelope> wait(bool (wire::Envelope::*has)() const, double seconds = 20) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      zmq::pollitem_t item{client.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      while (auto m = client.recv()) {
        if (((*m).*has)()) return m;
      }
    }
    return std::nullopt;
  }
  wire::RlRun hello(const net::PublicKey& key, const std::string& agent = "") {
    wire::Envelope e;
    e.mutable_rl_hello()->set_key(key);
    e.mutable_rl_hello()->set_agent(agent);
    client.send(e);
    auto m = wait(&wire::Envelope::has_rl_run);
    EXPECT_TRUE(m.has_value());
    return m ? m->rl_run() : wire::RlRun{};
  }
  wire::RlWork get_work(uint32_t slots) {
    wire::Envelope e;
    e.mutable_rl_get_work()->set_max_slots(slots);
    client.send(e);
    auto m = wait(&wire::Envelope::has_rl_work);
    EXPECT_TRUE(m.has_value());
    return m ? m->rl_work() : wire::RlWork{};
  }
  wire::RlReceipt submit(const Rollout& r, const std::string& run_id, bool forge = false) {
    const std::string bytes = encode_rollout(r);
    wire::Envelope e;
    e.mutable_rl_rollout()->set_rollout(bytes);
    std::string signature = identity.sign(rollout_signing_bytes(run_id, bytes));
    if (forge) signature[0] = static_cast<char>(signature[0] ^ 1);
    e.mutable_rl_rollout()->set_signature(signature);
    client.send(e);
    auto m = wait(&wire::Envelope::has_rl_receipt);
    EXPECT_TRUE(m.has_value());
    return m ? m->rl_receipt() : wire::RlReceipt{};
  }
};

TEST(RlNetwork, ALearnerTrainsOnAnHonestWorkerAndBansAHostileOne) {
  const fs::path tokenizer = fs::path(AGORA_DATA_DIR) / "tokenizer" / "agora-8k.model";
  ASSERT_TRUE(fs::exists(tokenizer)) << tokenizer << " is missing: run 'make data'";
  const fs::path root = fs::temp_directory_path() / ("agora_rl_net_" + std::to_string(getpid()));
  fs::remove_all(root);
  {
    Llama model = tiny_model(8192, 5);
    CheckpointMeta meta;
    meta.eot_id = 2;
    save_checkpoint(root / "base", model, meta, tokenizer.string(), "", std::nullopt);
  }
  const net::Identity learner_id = net::Identity::from_seed(std::string(32, '\x01'));
  LearnerOptions o;
  o.run_id = "rl-net-test";
  o.listen = "tcp://127.0.0.1:*";
  o.train.steps = 2;
  o.train.prompts_per_step = 2;
  o.train.group_size = 2;
  o.train.max_new_tokens = 4;
  o.train.eval_problems = 2;
  o.train.eval_interval = 0;
  o.train.table = false;
  o.train.out_dir = root / "learner";
  o.train.strikes_to_ban = 3;
  o.worker_messages_per_second = 20;
  o.worker_burst = 60;
  o.linger_seconds = 1;
  o.reassign_seconds = 2;  // the odd worker below never answers its slot
  std::atomic<bool> stop{false};
  o.stop = &stop;
  auto learner = std::async(std::launch::async, [&] {
    return serve_learner(load_checkpoint(root / "base", torch::kCPU), learner_id, o);
  });
  // A failed ASSERT returns from here: stop the learner first, or the future's destructor
  // waits for it forever.
  struct StopOnExit {
    std::atomic<bool>& stop;
    ~StopOnExit() { stop = true; }
  } stop_on_exit{stop};
  // The endpoint, from the learner's first event.
  std::string endpoint;
  for (int i = 0; i < 600 && endpoint.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream events(o.train.out_dir / "rl.jsonl");
    std::string line;
    while (std::getline(events, line)) {
      const auto row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_object() && row.value("event", "") == "rl_learner") endpoint = row.at("listen");
    }
  }
  ASSERT_FALSE(endpoint.empty());

  Hostile cheat(endpoint, learner_id.public_key(), 9);
  // A hello naming a key other than the one the connection proved is refused.
  EXPECT_FALSE(cheat.hello(net::Identity::from_seed(std::string(32, '\x02')).public_key())
                   .refused()
                   .empty());
  const wire::RlRun run = cheat.hello(cheat.identity.public_key());
  ASSERT_TRUE(run.refused().empty()) << run.refused();
  EXPECT_EQ(run.task(), "arithmetic");
  EXPECT_EQ(run.group_size(), 2u);
  LoadedCheckpoint base = load_checkpoint(root / "base", torch::kCPU);
  EXPECT_EQ(run.base_hash(), hash_parameters(base.model).state_hash);

  wire::RlWork work = cheat.get_work(1);
  ASSERT_EQ(work.slots_size(), 1);
  const auto task = make_task("arithmetic", TaskOptions{});
  Rollout r;
  r.task = "arithmetic";
  r.task_seed = run.task_seed();
  r.problem_id = work.slots(0).problem_id();
  r.sample = 1 - work.slots(0).sample();  // the other sample of the group: not handed to it
  r.policy_version = 0;
  r.tokens = {5, 6, 2};
  r.logprobs = {-0.01f, -0.01f, -0.01f};
  EXPECT_EQ(cheat.submit(r, run.run_id()).verdict(), "unassigned");
  r.sample = work.slots(0).sample();
  EXPECT_EQ(cheat.submit(r, run.run_id(), /*forge=*/true).verdict(), "bad_signature");
  EXPECT_EQ(cheat.submit(r, "another-run").verdict(), "bad_signature");  // signed for elsewhere
  // Invented log-probabilities (an untrained model gives these tokens about 1/8192 each).
  const wire::RlReceipt mismatch = cheat.submit(r, run.run_id());
  EXPECT_EQ(mismatch.verdict(), "mismatch") << mismatch.reason();
  // Three strikes (bad signatures and a mismatch): banned, and told so.
  EXPECT_FALSE(cheat.get_work(1).refused().empty());
  EXPECT_EQ(cheat.submit(r, run.run_id()).verdict(), "banned");

  // A worker whose agent string (it reaches the learner's logs) has a character cut in two at
  // the learner's 200-byte limit and terminal escapes (protobuf itself refuses strings that are
  // not UTF-8), and that claims a log-probability no sampled token has (it would overflow
  // GRPO's ratio).
  Hostile odd(endpoint, learner_id.public_key(), 11);
  std::string agent(199, 'a');
  agent += "\xc3\xa9\x1b[2J";
  ASSERT_TRUE(odd.hello(odd.identity.public_key(), agent).refused().empty());
  const wire::RlWork odd_work = odd.get_work(1);
  ASSERT_EQ(odd_work.slots_size(), 1);
  Rollout unlikely = r;
  unlikely.problem_id = odd_work.slots(0).problem_id();
  unlikely.sample = odd_work.slots(0).sample();
  unlikely.logprobs = {-0.5f, -60.0f, -0.5f};
  EXPECT_EQ(odd.submit(unlikely, run.run_id()).verdict(), "malformed");

  // A flood of requests from another worker: the learner answers at most its burst plus its
  // rate, and drops the rest.
  Hostile flood(endpoint, learner_id.public_key(), 10);
  ASSERT_TRUE(flood.hello(flood.identity.public_key()).refused().empty());
  const auto flood_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) {
    wire::Envelope e;
    e.mutable_rl_get_work()->set_max_slots(0);
    flood.client.send(e);
  }
  int answered = 0;
  while (flood.wait(&wire::Envelope::has_rl_work, 1.0)) ++answered;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  EXPECT_GT(answered, 0);
  EXPECT_LE(answered, o.worker_burst + o.worker_messages_per_second * seconds + 1);

  // An honest worker fills the step's slots (the banned worker's went back to the pool).
  RolloutWorkerOptions wo;
  wo.learner = endpoint;
  wo.learner_key = learner_id.public_key();
  wo.base = root / "base";
  wo.idle_timeout_seconds = 60;
  wo.progress = false;
  wo.log = root / "worker.jsonl";
  const net::Identity honest_id = net::Identity::from_seed(std::string(32, '\x03'));
  auto honest = std::async(std::launch::async, [&] { return run_rollout_worker(honest_id, wo); });
  ASSERT_EQ(learner.wait_for(std::chrono::seconds(300)), std::future_status::ready)
      << "the learner did not finish";
  const GrpoTrainSummary s = learner.get();
  const RolloutWorkerSummary w = honest.get();
  EXPECT_EQ(s.steps, 2);
  EXPECT_GE(s.strikes.at(net::key_to_hex(cheat.identity.public_key())), 3);
  EXPECT_EQ(s.strikes.at(net::key_to_hex(honest_id.public_key())), 0);
  EXPECT_EQ(s.strikes.at(net::key_to_hex(odd.identity.public_key())), 1);
  EXPECT_EQ(s.verdicts.at("mismatch"), 1);
  EXPECT_TRUE(w.finished);
  EXPECT_EQ(w.hash_mismatches, 0);
  EXPECT_GE(w.version, 1u);  // it took version 1 as a delta, hash-checked
  EXPECT_GT(w.policy_bytes, 0);
  EXPECT_EQ(w.receipts.at("accepted"), 2 * 2 * 2);
  fs::remove_all(root);
}

}  // namespace
}  // namespace agora
