#include "agora/rl/rollout_worker.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "agora/core/error.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/event_log.h"
#include "agora/rl/rollout.h"
#include "agora/rl/sampling.h"
#include "agora/rl/seeded_draw.h"
#include "agora/rl/task.h"
#include "agora/serve/member_client.h"
#include "agora/serve/param_feed.h"
#include "agora/train/checkpoint.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/published_policy.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

class Worker {
 public:
  Worker(const net::Identity& identity, const RolloutWorkerOptions& options);
  RolloutWorkerSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  void log(nlohmann::json row);
  // The next message that `want` accepts, counting receipts on the way; nullopt after `timeout`.
  std::optional<wire::Envelope> wait_for(const serve::MemberClient::Match& want, double timeout) {
    return member_.wait_for(want, timeout);
  }
  void count_receipt(const wire::RlReceipt& r);
  void join();
  wire::Envelope hello() const;
  // Brings the policy to the learner's `target` version, or fails naming both versions.
  void sync_policy(uint64_t target);
  uint64_t version() const { return follower_.version(); }
  void answer(const wire::RlWork& work);
  void send_rollout(const Rollout& rollout);
  void progress_line(bool force);

  const net::Identity& identity_;
  RolloutWorkerOptions options_;
  net::Context context_;
  net::Client client_;
  serve::MemberClient member_;  // hello, waits, saying hello again (serve/member_client.h)
  LoadedCheckpoint base_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Task> task_;
  serve::ParamFollower follower_;  // keeps base_.model at the learner's published version
  wire::RlRun run_;
  std::vector<wire::Envelope> last_batch_, this_batch_;  // replay's
  obs::EventLog log_;                                    // --log, or closed
  RolloutWorkerSummary summary_;
  const Clock::time_point started_ = Clock::now();
  double last_progress_ = 0;
};

net::DecodeLimits worker_limits() {
  net::DecodeLimits limits;
  limits.max_control = net::kMaxControlBytes;
  return limits;  // max_data: a whole policy
}

Worker::Worker(const net::Identity& identity, const RolloutWorkerOptions& options)
    : identity_(identity),
      options_(options),
      client_(context_, identity, options.learner, options.learner_key, worker_limits(),
              /*receive_queue=*/16384),
      member_(
          client_, hello(),
          [this](const wire::Envelope& m) {
            if (m.has_rl_receipt()) count_receipt(m.rl_receipt());
          },
          [this](const std::string& reason) {
            log({{"event", "rl_worker_rejoin"}, {"reason", reason}});
          }),
      base_(load_checkpoint(options.base, torch::kCPU)),
      follower_(
          member_, /*version=*/0,
          [this](const wire::Params& p) {
            PublishedPolicy::apply(base_.model, p.payload(), p.whole(), p.to_version());
            return hash_parameters(base_.model).state_hash;
          },
          [this](const wire::Params& p, int64_t bytes, bool ok, const std::string& error) {
            if (!error.empty())
              log({{"event", "rl_worker_policy_error"}, {"error", error.substr(0, 300)}});
            log({{"event", "rl_worker_policy"},
                 {"version", p.to_version()},
                 {"whole", p.whole()},
                 {"bytes", bytes},
                 {"hash_ok", ok}});
          }) {
  if (base_.tokenizer_spec.empty())
    fail("the base checkpoint {} names no tokenizer", options.base.string());
  tokenizer_ = load_tokenizer(base_.tokenizer_spec);
  base_.model->eval();
  if (!options_.log.empty())
    log_ = obs::EventLog(options_.log, /*append=*/false, [this] { return now(); });
}

void Worker::log(nlohmann::json row) {
  log_.write(std::move(row));
}

void Worker::count_receipt(const wire::RlReceipt& r) {
  ++summary_.receipts[r.verdict().substr(0, 32)];
  if (r.verdict() != "accepted") {
    log({{"event", "rl_worker_refused"},
         {"problem_id", r.problem_id()},
         {"sample", r.sample()},
         {"verdict", r.verdict().substr(0, 32)},
         {"reason", r.reason().substr(0, 300)}});
  }
}

wire::Envelope Worker::hello() const {
  wire::Envelope hello;
  hello.mutable_rl_hello()->set_key(identity_.public_key());
  hello.mutable_rl_hello()->set_agent(
      fmt::format("agora rl work ({})", behaviour_name(options_.behaviour)));
  return hello;
}

void Worker::join() {
  std::optional<wire::Envelope> m = member_.join(
      [](const wire::Envelope& e) { return e.has_rl_run(); }, options_.idle_timeout_seconds);
  if (!m) {
    fail(
        "the learner at {} did not answer for {:g} s (is it running, and is --learner-key its "
        "public key?)",
        options_.learner, options_.idle_timeout_seconds);
  }
  run_ = m->rl_run();
  if (!run_.refused().empty()) fail("the learner refused this worker: {}", run_.refused());
  const std::string hash = hash_parameters(base_.model).state_hash;
  if (hash != run_.base_hash()) {
    fail(
        "the base checkpoint {} has state hash {}, but the learner's run starts from {}: give "
        "--base the checkpoint the learner was started with",
        options_.base.string(), net::key_to_hex(hash),
        run_.base_hash().size() == net::kKeyBytes ? net::key_to_hex(run_.base_hash()) : "?");
  }
  TaskOptions task;
  task.seed = run_.task_seed();
  task.held_out_fraction = run_.held_out_fraction();
  task.max_digits = static_cast<int>(run_.max_digits());
  task.numbers = static_cast<int>(run_.numbers());
  task_ = make_task(run_.task(), task);
  if (run_.group_size() < 1 || run_.max_new_tokens() < 1 || run_.max_new_tokens() > 4096 ||
      !(run_.temperature() > 0)) {
    fail("the learner sent an unusable run: group size {}, max new tokens {}, temperature {}",
         run_.group_size(), run_.max_new_tokens(), run_.temperature());
  }
  log({{"event", "rl_worker_joined"},
       {"key", net::key_to_hex(identity_.public_key())},
       {"run_id", run_.run_id().substr(0, 200)},
       {"task", task_->name()},
       {"version", run_.version()},
       {"behaviour", std::string(behaviour_name(options_.behaviour))}});
}

void Worker::sync_policy(uint64_t target) {
  if (!follower_.sync(target)) {
    fail("could not bring the policy from version {} to {} (the learner sent no usable update)",
         version(), target);
  }
}

void Worker::send_rollout(const Rollout& rollout) {
  const std::string bytes = encode_rollout(rollout);
  wire::Envelope e;
  e.mutable_rl_rollout()->set_rollout(bytes);
  e.mutable_rl_rollout()->set_signature(
      identity_.sign(rollout_signing_bytes(run_.run_id(), bytes)));
  client_.send(e);
  ++summary_.submitted;
  if (options_.behaviour == WorkerBehaviour::kReplay) {
    client_.send(e);
    ++summary_.submitted;
    this_batch_.push_back(e);
  }
}

void Worker::answer(const wire::RlWork& work) {
  const TokenId eot = tokenizer_->eot_id();
  std::map<uint64_t, std::vector<uint32_t>> by_problem;
  for (const auto& s : work.slots()) {
    if (s.sample() < run_.group_size()) by_problem[s.problem_id()].push_back(s.sample());
  }
  const WorkerBehaviour b = options_.behaviour;
  for (const auto& [problem_id, samples] : by_problem) {
    const Problem problem = task_->make(problem_id);
    Rollout r;
    r.task = task_->name();
    r.task_seed = task_->seed();
    r.problem_id = problem_id;
    if (b == WorkerBehaviour::kFabricate || b == WorkerBehaviour::kTeacherForce) {
      const std::vector<TokenId> answer = tokenizer_->encode(problem.solution);
      r.tokens.assign(answer.begin(), answer.end());
      r.tokens.push_back(eot);
      r.logprobs =
          b == WorkerBehaviour::kFabricate
              ? std::vector<float>(r.tokens.size(), -0.01f)
              : teacher_forced_logprobs(base_.model, eot, tokenizer_->encode(problem.prompt),
                                        r.tokens, run_.temperature());
      r.policy_version = b == WorkerBehaviour::kFabricate ? work.version() : version();
      for (uint32_t sample : samples) {
        r.sample = sample;
        send_rollout(r);
      }
      continue;
    }
    CompletionSampling sampling;
    sampling.count = static_cast<int64_t>(samples.size());
    sampling.max_new_tokens = run_.max_new_tokens();
    sampling.temperature = run_.temperature();
    // Each slot's tokens are drawn by its seed, which the learner checks (seeded_draw.h).
    for (uint32_t sample : samples) {
      sampling.row_seeds.push_back(slot_seed(run_.run_id(), problem_id, sample));
    }
    const std::vector<Completion> group =
        sample_completions(base_.model, eot, tokenizer_->encode(problem.prompt), sampling);
    r.policy_version = b == WorkerBehaviour::kStale        ? 0
                       : b == WorkerBehaviour::kOtherModel ? work.version()
                                                           : version();
    for (size_t k = 0; k < group.size(); ++k) {
      r.sample = samples[k];
      r.tokens.assign(group[k].tokens.begin(), group[k].tokens.end());
      r.logprobs = group[k].logprobs;
      send_rollout(r);
    }
  }
  if (b == WorkerBehaviour::kReplay) {
    for (const wire::Envelope& e : last_batch_) {
      client_.send(e);
      ++summary_.submitted;
    }
    last_batch_ = std::move(this_batch_);
    this_batch_.clear();
  }
}

void Worker::progress_line(bool force) {
  if (!options_.progress || (!force && now() - last_progress_ < 5)) return;
  last_progress_ = now();
  const int64_t accepted =
      summary_.receipts.count("accepted") ? summary_.receipts.at("accepted") : 0;
  int64_t receipts = 0;
  for (const auto& [verdict, n] : summary_.receipts) receipts += n;
  fmt::print(stderr,
             "worker {}: policy version {}, {} rollouts submitted ({:.1f}/s), {} accepted, {} "
             "refused\n",
             net::short_key(identity_.public_key()), version(), summary_.submitted,
             static_cast<double>(summary_.submitted) / std::max(1e-9, now()), accepted,
             receipts - accepted);
}

RolloutWorkerSummary Worker::run() {
  join();
  const bool follows = options_.behaviour == WorkerBehaviour::kHonest ||
                       options_.behaviour == WorkerBehaviour::kFabricate ||
                       options_.behaviour == WorkerBehaviour::kTeacherForce ||
                       options_.behaviour == WorkerBehaviour::kReplay;
  double last_answer = now();
  uint64_t last_version = run_.version();  // the newest the learner has named
  while (true) {
    wire::Envelope ask;
    ask.mutable_rl_get_work()->set_max_slots(options_.slots_per_request);
    client_.send(ask);
    std::optional<wire::Envelope> m =
        wait_for([](const wire::Envelope& e) { return e.has_rl_work(); }, 5.0);
    if (!m) {
      // After the run's last update the learner lingers a few seconds, then leaves: a worker
      // still sampling the last step finds it gone, and that is the end of the run, not an error.
      const bool last_step = run_.steps() > 0 && last_version + 1 >= run_.steps();
      if (last_step && now() - last_answer > std::min(10.0, options_.idle_timeout_seconds)) {
        summary_.finished = true;
        log({{"event", "rl_worker_learner_gone"}, {"version", last_version}});
        break;
      }
      if (now() - last_answer > options_.idle_timeout_seconds) {
        fail("the learner at {} stopped answering ({:g} s without work or an answer)",
             options_.learner, options_.idle_timeout_seconds);
      }
      continue;
    }
    last_answer = now();
    const wire::RlWork& work = m->rl_work();
    last_version = std::max(last_version, work.version());
    if (!work.refused().empty()) {
      summary_.refused = work.refused().substr(0, 300);
      log({{"event", "rl_worker_banned"}, {"reason", summary_.refused}});
      break;
    }
    if (work.finished()) {
      summary_.finished = true;
      break;
    }
    if (follows && work.version() > version()) sync_policy(work.version());
    if (follows && work.version() < version()) {
      // The learner restarted from an older save: its policy is not the one this worker holds.
      log({{"event", "rl_worker_policy_behind"}, {"mine", version()}, {"learner", work.version()}});
      follower_.forget();
      sync_policy(work.version());
    }
    if (work.slots_size() == 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::clamp<uint32_t>(work.retry_ms(), 10, 5000)));
      progress_line(false);
      continue;
    }
    answer(work);
    progress_line(false);
  }
  // The receipts still on their way.
  wait_for([](const wire::Envelope&) { return false; }, 0.5);
  progress_line(true);
  summary_.version = version();
  summary_.policy_bytes = follower_.bytes();
  summary_.hash_mismatches = follower_.hash_mismatches();
  summary_.seconds = now();
  log({{"event", "rl_worker_done"},
       {"submitted", summary_.submitted},
       {"receipts", summary_.receipts},
       {"version", version()},
       {"policy_bytes", summary_.policy_bytes},
       {"hash_mismatches", summary_.hash_mismatches},
       {"finished", summary_.finished},
       {"refused", summary_.refused}});
  return summary_;
}

}  // namespace

RolloutWorkerSummary run_rollout_worker(const net::Identity& identity,
                                        const RolloutWorkerOptions& options) {
  if (options.slots_per_request < 1 || options.slots_per_request > 1024) {
    fail("rl worker slots per request {} is invalid (allowed: 1 to 1024)",
         options.slots_per_request);
  }
  if (!(options.idle_timeout_seconds > 0)) {
    fail("rl worker idle timeout {} is invalid (allowed: > 0 seconds)",
         options.idle_timeout_seconds);
  }
  Worker worker(identity, options);
  return worker.run();
}

}  // namespace agora
