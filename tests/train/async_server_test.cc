// The outer server of asynchronous data parallelism (async/outer_server.h) against clients that
// speak its protocol by hand, over real sockets in one process: every way a worker can lie about
// a delivery is refused with the verdict that names it, three strikes ban, a flood is cut to the
// bucket, and an honest delivery moves theta, whose int8 delta a worker applies to the same
// state hash.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "agora/async/outer_server.h"
#include "agora/async/rules.h"
#include "agora/net/curve_socket.h"
#include "agora/optim/payload.h"
#include "agora/optim/payload_tensors.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/published_policy.h"
#include "agora/train/step.h"

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
  wire::AsyncRun hello(const net::PublicKey& key) {
    wire::Envelope e;
    e.mutable_async_hello()->set_key(key);
    client.send(e);
    auto m = wait(&wire::Envelope::has_async_run);
    EXPECT_TRUE(m.has_value());
    return m ? m->async_run() : wire::AsyncRun{};
  }
  // Work from version `have`, retrying while the run waits for its workers.
  wire::AsyncWork work(uint64_t have) {
    for (int i = 0; i < 200; ++i) {
      wire::Envelope e;
      e.mutable_async_get_work()->set_have_version(have);
      client.send(e);
      auto m = wait(&wire::Envelope::has_async_work);
      EXPECT_TRUE(m.has_value());
      if (!m) return {};
      if (m->async_work().steps() > 0 || !m->async_work().refused().empty() ||
          m->async_work().version() != have) {
        return m->async_work();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
  }
  wire::AsyncReceipt deliver(uint64_t work_id, const std::string& payload, const std::string& run,
                             bool forge = false, double wait_seconds = 20) {
    wire::Envelope e;
    e.mutable_async_delivery()->set_work_id(work_id);
    e.mutable_async_delivery()->set_payload(payload);
    std::string signature = identity.sign(delivery_signing_bytes(run, work_id, payload));
    if (forge) signature[0] = static_cast<char>(signature[0] ^ 1);
    e.mutable_async_delivery()->set_signature(signature);
    client.send(e);
    auto m = wait(&wire::Envelope::has_async_receipt, wait_seconds);
    EXPECT_TRUE(m.has_value() || wait_seconds < 20);
    return m ? m->async_receipt() : wire::AsyncReceipt{};
  }
};

// A pseudo-gradient of `value` everywhere, as int8 rows, for work `work_id`.
std::string filled_payload(Llama& model, uint64_t work_id, float value) {
  Payload p;
  p.kind = PayloadKind::kPseudoGradient;
  p.step = work_id;
  for (const auto& t : model->parameters()) {
    p.tensors.push_back(int8_rows_payload(torch::full_like(t.detach(), value)));
  }
  return encode_payload(p);
}

// The events the server wrote so far.
std::vector<nlohmann::json> events_of(const fs::path& out) {
  std::vector<nlohmann::json> rows;
  std::ifstream events(out / "events.jsonl");
  std::string line;
  while (std::getline(events, line)) {
    auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object()) rows.push_back(std::move(row));
  }
  return rows;
}

// The endpoint the server announces (async_start), waiting up to 30 s; "" (with the failure
// reported) when it ended or failed first.
std::string await_endpoint(std::future<OuterServerSummary>& server, const fs::path& out) {
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const nlohmann::json& row : events_of(out)) {
      if (row.value("event", "") == "async_start") return row.at("listen");
    }
    if (server.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      try {
        server.get();
        ADD_FAILURE() << "the server ended before it listened";
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the server failed: " << e.what();
      }
      return "";
    }
  }
  return "";
}

TEST(AsyncServer, RefusesEveryLieAndAppliesAnHonestDelivery) {
  const fs::path data = fs::path(AGORA_DATA_DIR) / "tokens" / "sp8k";
  ASSERT_TRUE(fs::exists(data / "meta.json")) << data << " is missing: run 'make data'";
  const fs::path root = fs::temp_directory_path() / ("agora_async_" + std::to_string(getpid()));
  fs::remove_all(root);
  const RunConfig config =
      RunConfig::load(fs::path(AGORA_SOURCE_DIR) / "bench" / "async" / "async.toml",
                      {"data.dir=" + data.string(), "train.eval_windows=2"});
  const net::Identity server_id = net::Identity::from_seed(std::string(32, '\x01'));
  OuterServerOptions o;
  o.run_id = "async-test";
  o.listen = "tcp://127.0.0.1:*";
  o.workers = 1;
  o.method = "lookahead";
  o.seconds = 600;
  o.eval_every = 300;
  o.max_strikes = 3;
  o.worker_messages_per_second = 20;
  o.worker_burst = 60;
  o.linger_seconds = 0.2;
  o.progress = false;
  o.out = root / "server";
  std::atomic<bool> stop{false};
  o.stop = &stop;
  auto server = std::async(std::launch::async, [&] { return serve_outer(config, server_id, o); });
  struct StopOnExit {
    std::atomic<bool>& stop;
    ~StopOnExit() { stop = true; }
  } stop_on_exit{stop};
  const std::string endpoint = await_endpoint(server, o.out);
  ASSERT_FALSE(endpoint.empty());

  RunConfig inner = config;
  inner.optimizer.name = "adamw";
  Llama model = Learner::create(inner, torch::kCPU).model;

  Client cheat(endpoint, server_id.public_key(), 9);
  // A hello naming another key than the connection proved is refused.
  EXPECT_FALSE(cheat.hello(net::Identity::from_seed(std::string(32, '\x02')).public_key())
                   .refused()
                   .empty());
  const wire::AsyncRun run = cheat.hello(cheat.identity.public_key());
  ASSERT_TRUE(run.refused().empty()) << run.refused();
  EXPECT_EQ(run.method(), "lookahead");
  EXPECT_TRUE(run.int8());
  EXPECT_EQ(run.sequences_per_step(), 32u);
  EXPECT_EQ(run.base_hash(), hash_parameters(model).state_hash);

  wire::AsyncWork work = cheat.work(0);
  ASSERT_GT(work.steps(), 0u);
  EXPECT_EQ(work.steps(), 10u);  // H = diloco.inner_steps
  const std::string zero = filled_payload(model, work.work_id(), 0.0f);
  // Work it was not handed (a replay of a finished piece looks the same): strike 1.
  EXPECT_EQ(cheat
                .deliver(work.work_id() + 1, filled_payload(model, work.work_id() + 1, 0.0f),
                         run.run_id())
                .verdict(),
            kUnassigned);
  // A forged signature, and one for another run: strikes 2 and 3 (the first uses up the work).
  EXPECT_EQ(cheat.deliver(work.work_id(), zero, run.run_id(), /*forge=*/true).verdict(),
            kBadSignature);
  // Banned: told so when it asks for work, and its deliveries are ignored.
  work = cheat.work(0);
  ASSERT_GT(work.steps(), 0u);
  EXPECT_EQ(cheat.deliver(work.work_id(), filled_payload(model, work.work_id(), 0.0f), "other-run")
                .verdict(),
            kBadSignature);
  EXPECT_FALSE(cheat.work(0).refused().empty());

  Client odd(endpoint, server_id.public_key(), 11);
  ASSERT_TRUE(odd.hello(odd.identity.public_key()).refused().empty());
  // Float32 where the run wants int8: four times the size a delivery may have, so the socket
  // drops it unread (no receipt, no strike, the work still held).
  work = odd.work(0);
  ASSERT_GT(work.steps(), 0u);
  Payload dense;
  dense.kind = PayloadKind::kPseudoGradient;
  dense.step = work.work_id();
  for (const auto& t : model->parameters()) {
    dense.tensors.push_back(dense_payload(torch::zeros_like(t.detach()), ValueType::kF32));
  }
  EXPECT_EQ(odd.deliver(work.work_id(), encode_payload(dense), run.run_id(), false, 2.0).verdict(),
            "");
  // A payload for another step, and one cut short: malformed, strikes 1 and 2.
  EXPECT_EQ(
      odd.deliver(work.work_id(), filled_payload(model, work.work_id() + 7, 0.0f), run.run_id())
          .verdict(),
      kMalformed);
  work = odd.work(0);
  std::string cut = filled_payload(model, work.work_id(), 0.0f);
  cut.resize(cut.size() - 10);
  EXPECT_EQ(odd.deliver(work.work_id(), cut, run.run_id()).verdict(), kMalformed);
  // Larger than theta itself: an outlier, and the third strike.
  work = odd.work(0);
  const wire::AsyncReceipt huge =
      odd.deliver(work.work_id(), filled_payload(model, work.work_id(), 50.0f), run.run_id());
  EXPECT_EQ(huge.verdict(), kOutlier) << huge.reason();
  EXPECT_EQ(huge.version(), 0u) << "nothing refused moved theta";

  // A flood: answered at most up to the bucket.
  Client flood(endpoint, server_id.public_key(), 10);
  ASSERT_TRUE(flood.hello(flood.identity.public_key()).refused().empty());
  const auto flood_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) {
    wire::Envelope e;
    e.mutable_async_get_work()->set_have_version(12345);
    flood.client.send(e);
  }
  int answered = 0;
  while (flood.wait(&wire::Envelope::has_async_work, 1.0)) ++answered;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  EXPECT_GT(answered, 0);
  EXPECT_LE(answered, o.worker_burst + o.worker_messages_per_second * seconds + 2);

  // An honest delivery moves theta to version 1, and a worker applying the server's delta
  // reaches the state hash the server sent.
  Client honest(endpoint, server_id.public_key(), 12);
  ASSERT_TRUE(honest.hello(honest.identity.public_key()).refused().empty());
  work = honest.work(0);
  ASSERT_GT(work.steps(), 0u);
  // Asking again (a restarted worker) gives the same work, not a second piece.
  const wire::AsyncWork again = honest.work(0);
  EXPECT_EQ(again.work_id(), work.work_id());
  EXPECT_EQ(again.first_sequence(), work.first_sequence());
  const wire::AsyncReceipt ok =
      honest.deliver(work.work_id(), filled_payload(model, work.work_id(), 1e-3f), run.run_id());
  EXPECT_EQ(ok.verdict(), kAccepted) << ok.reason();
  EXPECT_EQ(ok.version(), 1u);
  wire::Envelope ask;
  ask.mutable_get_params()->set_have_version(0);
  honest.client.send(ask);
  const auto params = honest.wait(&wire::Envelope::has_params);
  ASSERT_TRUE(params.has_value());
  EXPECT_EQ(params->params().to_version(), 1u);
  PublishedPolicy::apply(model, params->params().payload(), params->params().whole(), 1);
  EXPECT_EQ(hash_parameters(model).state_hash, params->params().state_hash());

  stop = true;
  const OuterServerSummary s = server.get();
  EXPECT_EQ(s.updates, 1);
  EXPECT_EQ(s.verdicts.at(std::string(kAccepted)), 1);
  EXPECT_EQ(s.verdicts.at(std::string(kBadSignature)), 2);
  EXPECT_EQ(s.verdicts.at(std::string(kMalformed)), 2);
  EXPECT_EQ(s.banned.size(), 2u);
  EXPECT_TRUE(fs::exists(o.out / "final"));
  fs::remove_all(root);
}

// Under sync a round waited for every serving worker's piece: a worker that held its work and
// never delivered, or never asked for work, held the run at its round for good. Past the
// round's deadline the held piece lapses, the round closes with what came, and both are struck.
TEST(AsyncServer, ASyncRoundClosesAtItsDeadlineWithoutHoldersAndAbsentees) {
  const fs::path data = fs::path(AGORA_DATA_DIR) / "tokens" / "sp8k";
  ASSERT_TRUE(fs::exists(data / "meta.json")) << data << " is missing: run 'make data'";
  const fs::path root =
      fs::temp_directory_path() / ("agora_async_sync_" + std::to_string(getpid()));
  fs::remove_all(root);
  const RunConfig config =
      RunConfig::load(fs::path(AGORA_SOURCE_DIR) / "bench" / "async" / "async.toml",
                      {"data.dir=" + data.string(), "train.eval_windows=2"});
  const net::Identity server_id = net::Identity::from_seed(std::string(32, '\x03'));
  OuterServerOptions o;
  o.run_id = "async-sync-test";
  o.listen = "tcp://127.0.0.1:*";
  o.workers = 2;  // the run starts with two; the third (idle) joins before the first round
  o.method = "sync";
  o.seconds = 600;
  o.eval_every = 300;
  o.max_strikes = 2;
  o.min_deadline = 0.5;
  o.deadline_factor = 2;  // 1 s before anything is measured
  o.linger_seconds = 0.2;
  o.progress = false;
  o.out = root / "server";
  std::atomic<bool> stop{false};
  o.stop = &stop;
  auto server = std::async(std::launch::async, [&] { return serve_outer(config, server_id, o); });
  struct StopOnExit {
    std::atomic<bool>& stop;
    ~StopOnExit() { stop = true; }
  } stop_on_exit{stop};
  const std::string endpoint = await_endpoint(server, o.out);
  ASSERT_FALSE(endpoint.empty());
  RunConfig inner = config;
  inner.optimizer.name = "adamw";
  Llama model = Learner::create(inner, torch::kCPU).model;

  Client honest(endpoint, server_id.public_key(), 20), holder(endpoint, server_id.public_key(), 21),
      idle(endpoint, server_id.public_key(), 22);
  const wire::AsyncRun run = honest.hello(honest.identity.public_key());
  ASSERT_TRUE(holder.hello(holder.identity.public_key()).refused().empty());
  ASSERT_TRUE(idle.hello(idle.identity.public_key()).refused().empty());  // and nothing more

  for (uint64_t round = 0; round < 2; ++round) {
    wire::AsyncWork work = honest.work(round);
    ASSERT_GT(work.steps(), 0u) << "round " << round;
    if (round == 0) {
      ASSERT_GT(holder.work(0).steps(), 0u);  // takes its piece, never delivers
    }
    const wire::AsyncReceipt ok =
        honest.deliver(work.work_id(), filled_payload(model, work.work_id(), 1e-3f), run.run_id());
    ASSERT_EQ(ok.verdict(), kAccepted) << ok.reason();
    // The round closes once its deadline passes: version round + 1.
    const wire::AsyncWork next = honest.work(round);
    ASSERT_EQ(next.version(), round + 1) << "round " << round << " never closed";
    wire::Envelope ask;
    ask.mutable_get_params()->set_have_version(round);
    honest.client.send(ask);
    ASSERT_TRUE(honest.wait(&wire::Envelope::has_params).has_value());
  }
  stop = true;
  const OuterServerSummary s = server.get();
  EXPECT_EQ(s.updates, 2);
  EXPECT_EQ(s.banned.size(), 2u);  // the holder and the idle one, two strikes each
  std::map<std::string, std::vector<std::string>> states;
  for (const nlohmann::json& row : events_of(o.out)) {
    if (row.value("event", "") == "async_worker" && row.contains("state")) {
      states[row.value("worker", "")].push_back(row["state"]);
    }
  }
  const std::string h = net::key_to_hex(honest.identity.public_key());
  for (const std::string& state : states[h]) EXPECT_EQ(state, "joined") << "honest: " << state;
  const auto& held = states[net::key_to_hex(holder.identity.public_key())];
  EXPECT_NE(std::find(held.begin(), held.end(), "late"), held.end());
  EXPECT_NE(std::find(held.begin(), held.end(), "banned"), held.end());
  const auto& absent = states[net::key_to_hex(idle.identity.public_key())];
  EXPECT_EQ(std::count(absent.begin(), absent.end(), "absent"), 2);
  EXPECT_NE(std::find(absent.begin(), absent.end(), "banned"), absent.end());
  fs::remove_all(root);
}

}  // namespace
}  // namespace agora
