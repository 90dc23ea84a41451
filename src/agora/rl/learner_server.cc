#include "agora/rl/learner_server.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/net/allowlist.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/rl/group_batch.h"
#include "agora/rl/held_out.h"
#include "agora/rl/learner_detail.h"
#include "agora/rl/policy_versions.h"
#include "agora/rl/rl_progress.h"
#include "agora/rl/rollout_intake.h"
#include "agora/rl/slot_pool.h"
#include "agora/serve/poll.h"
#include "agora/train/published_policy.h"

namespace agora {
namespace fs = std::filesystem;
namespace learner_detail {
namespace {

IntakeOptions intake_options(const LearnerOptions& o, const Task& task, int64_t vocab) {
  IntakeOptions io;
  io.task = task.name();
  io.task_seed = task.seed();
  io.max_off_policy_steps = static_cast<uint64_t>(o.train.max_off_policy_steps);
  io.group_size = static_cast<uint32_t>(o.train.group_size);
  io.limits.max_tokens = static_cast<uint32_t>(o.train.max_new_tokens);
  io.limits.vocab_size = static_cast<uint32_t>(vocab);
  io.limits.min_logprob = kMinRolloutLogprob;
  io.strikes_to_ban = o.train.strikes_to_ban;
  return io;
}

SlotPoolOptions pool_options(const LearnerOptions& o) {
  SlotPoolOptions so;
  so.group_size = static_cast<uint32_t>(o.train.group_size);
  so.reassign_seconds = o.reassign_seconds;
  so.max_slots_per_worker = o.max_slots_per_worker;
  return so;
}

std::unique_ptr<Tokenizer> base_tokenizer(const LoadedCheckpoint& base) {
  if (base.tokenizer_spec.empty()) fail("the base checkpoint names no tokenizer");
  return load_tokenizer(base.tokenizer_spec);
}

// A worker silent for two minutes is forgotten (its slots go back; a ban stays in the intake),
// hellos from strangers at most 20 a second.
serve::MemberLimits worker_limits(const LearnerOptions& o) {
  serve::MemberLimits limits;
  limits.max_members = o.max_workers;
  limits.idle_seconds = 120;
  limits.member_rate = o.worker_messages_per_second;
  limits.member_burst = o.worker_burst;
  limits.stranger_rate = 20;
  limits.stranger_burst = 100;
  return limits;
}

// Deltas for twice the versions a rollout may lag (at least 8): a worker that far behind catches
// up by deltas; one further behind gets the whole policy.
serve::ParamFeed::Limits feed_limits(const LearnerOptions& o) {
  serve::ParamFeed::Limits limits;
  limits.bytes_in_flight = o.max_policy_bytes_in_flight;
  limits.bytes_per_member = o.max_policy_bytes_per_worker;
  limits.deltas_kept =
      static_cast<size_t>(std::max<int64_t>(8, 2 * o.train.max_off_policy_steps + 2));
  return limits;
}

}  // namespace

Learner::Learner(LoadedCheckpoint base, const net::Identity& identity,
                 const LearnerOptions& options)
    : options_(options),
      base_(std::move(base)),
      live_(base_.model),
      tokenizer_(base_tokenizer(base_)),
      eot_(static_cast<TokenId>(base_.meta.eot_id)),
      task_(make_task(options.task_name, options.task)),
      optimizer_(live_->parameters(),
                 torch::optim::AdamWOptions(options.train.lr).betas({0.9, 0.99}).weight_decay(0.0)),
      published_(live_),
      versions_(published_.model(), options.train.max_off_policy_steps),
      base_hash_(published_.state_hash()),
      key_hex_(net::key_to_hex(identity.public_key())),
      intake_(intake_options(options, *task_, live_->config().vocab_size)),
      pool_(pool_options(options)),
      context_(options.admission),
      server_(context_, identity, options.listen, net::DecodeLimits{net::kMaxControlBytes, 0},
              /*reply_queue=*/kReplyQueue),
      feed_(feed_limits(options), [this] { return published_.whole(); }, published_.version(),
            published_.state_hash()),
      workers_(worker_limits(options)),
      rescore_draw_(std::random_device{}()) {
  live_->train();
  fs::create_directories(options_.train.out_dir);
  resume();  // an unfinished run in out_dir goes on where its last save was
  events_ = obs::EventLog(options_.train.out_dir / "rl.jsonl", /*append=*/resumed_,
                          [this] { return now(); });
  if (live_->config().max_seq_len < 2 + options_.train.max_new_tokens) {
    fail("rl max new tokens {} does not fit the model's context of {} tokens",
         options_.train.max_new_tokens, live_->config().max_seq_len);
  }
  if (options_.http) start_http();
  publish_status();
}

void Learner::log_event(nlohmann::json row) {
  events_.write(std::move(row));
}

void Learner::open_step() {
  problems_.clear();
  prompts_.clear();
  std::vector<uint64_t> ids;
  for (int64_t j = 0; j < options_.train.prompts_per_step; ++j) {
    problems_.push_back(task_->next(cursor_, /*want_held_out=*/false));
    ids.push_back(problems_.back().id);
    prompts_[ids.back()] = tokenizer_->encode(problems_.back().prompt);
    intake_.open(ids.back());
  }
  intake_.set_version(published_.version());
  pool_.open(ids);
  filled_.clear();
  step_opened_ = now();
  submitted_ = refused_ = 0;
}

bool Learner::step_ready() const {
  if (pool_.complete()) return true;
  if (options_.step_timeout_seconds <= 0 || now() - step_opened_ < options_.step_timeout_seconds)
    return false;
  std::map<uint64_t, int> per_problem;
  for (const auto& [slot, filled] : filled_) {
    if (++per_problem[slot.problem] >= 2) return true;
  }
  return false;
}

void Learner::train_step() {
  GroupBatch batch;
  batch.submitted = submitted_;
  batch.refused = refused_;
  for (const Problem& p : problems_) {
    std::vector<Sample> samples;
    for (auto it = filled_.lower_bound({p.id, 0}); it != filled_.end() && it->first.problem == p.id;
         ++it) {
      const Rollout& r = it->second.second;
      samples.push_back({{r.tokens.begin(), r.tokens.end()}, r.logprobs});
    }
    add_group(batch, *task_, *tokenizer_, p, tokenizer_->encode(p.prompt), std::move(samples),
              options_.train.grpo);
    intake_.close(p.id);
  }
  const GrpoLoss loss = grpo_update(live_, optimizer_, eot_, batch, options_.train.temperature,
                                    options_.train.grad_clip, options_.train.grpo);
  ++step_;
  {
    std::string delta = published_.advance(live_);
    feed_.publish(published_.version(), std::move(delta), published_.state_hash());
    versions_.advance();
  }

  GrpoStepStats s = step_stats(step_, batch, loss, options_.train.prompts_per_step, rollouts_);
  const int64_t steps = options_.train.steps;
  const bool evaluate = step_ == steps || (options_.train.eval_interval > 0 &&
                                           step_ % options_.train.eval_interval == 0);
  if (evaluate) {
    s.held_out = last_held_out_ =
        score_held_out(live_, *tokenizer_, *task_, options_.train.eval_problems,
                       options_.train.max_new_tokens)
            .accuracy();
  }
  s.seconds = now();
  log_event(rl_step_json(s));
  history_.push_back(s);
  if (options_.train.table && (evaluate || step_ == 1 || step_ % 5 == 0)) {
    print_rl_table_row(s, last_held_out_, steps);
  }
  if (step_ < steps && options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0) {
    save_resume(/*finished=*/false);  // before the next step draws its problems
  }
  if (step_ < steps) open_step();
  publish_status();
}

GrpoTrainSummary Learner::run() {
  log_event({{"event", "rl_learner"},
             {"listen", server_.bound_endpoint()},
             {"key", key_hex_},
             {"admission", net::describe(options_.admission)},
             {"stranger_rate", workers_.limits().stranger_rate},
             {"stranger_burst", workers_.limits().stranger_burst},
             {"http", http_ ? http_->url() : ""},
             {"base_hash", net::key_to_hex(base_hash_)}});
  if (resumed_) {
    log_event({{"event", "rl_resume"}, {"step", step_}, {"version", published_.version()}});
  } else {
    // Workers may connect meanwhile: ZeroMQ holds their hellos until the loop below reads them.
    summary_.base_accuracy = last_held_out_ =
        score_held_out(live_, *tokenizer_, *task_, options_.train.eval_problems,
                       options_.train.max_new_tokens)
            .accuracy();
    GrpoStepStats s;
    s.held_out = summary_.base_accuracy;
    s.seconds = now();
    log_event(rl_step_json(s));
  }
  if (options_.train.table) {
    fmt::print("learner {} listening on {}{}\n", key_hex_, server_.bound_endpoint(),
               http_ ? "; status page " + http_->url() : "");
    print_rl_table_header();
    GrpoStepStats s;
    s.seconds = now();
    print_rl_table_row(s, summary_.base_accuracy, options_.train.steps);
  }
  if (step_ < options_.train.steps) open_step();
  publish_status();
  double finished_at = step_ >= options_.train.steps ? now() : -1;
  double last_status = now();
  const auto stopped = [&] { return options_.stop && options_.stop->load(); };
  while ((finished_at < 0 || now() - finished_at < options_.linger_seconds) && !stopped()) {
    serve::wait_readable(server_.socket(), std::chrono::milliseconds(pending_.empty() ? 20 : 0));
    serve::drain(server_, {}, [this](const net::Incoming& in) { handle(in); });
    rescore_pending();
    if (finished_at < 0 && step_ready()) {
      train_step();
      if (step_ >= options_.train.steps) finished_at = now();
    }
    if (now() - last_status > 1) {
      evict_idle();
      publish_status();
      last_status = now();
    }
  }
  publish_status();

  summary_.final_accuracy = last_held_out_;
  summary_.steps = step_;
  summary_.rollouts = rollouts_;
  summary_.seconds = now();
  summary_.verdicts = receipts_;
  for (const auto& [curve, w] : workers_) summary_.strikes[w.name] = intake_.strikes(w.name);
  log_event(
      {{"event", "rl_intake"}, {"verdicts", summary_.verdicts}, {"strikes", summary_.strikes}});

  CheckpointMeta meta = base_.meta;
  meta.step = base_.meta.step + static_cast<uint64_t>(step_);
  meta.val_loss = NAN;
  summary_.checkpoint = options_.train.out_dir / "latest";
  save_checkpoint(summary_.checkpoint, live_, meta, base_.tokenizer_spec, base_.run_config_toml,
                  std::nullopt);
  // A run that did all its updates is finished (out_dir starts a new run next time); one
  // stopped by a signal stays resumable.
  save_resume(/*finished=*/step_ >= options_.train.steps);
  return summary_;
}

}  // namespace learner_detail

void validate(const LearnerOptions& o) {
  GrpoTrainOptions train = o.train;
  train.workers.clear();
  validate(train);
  if (!(o.rescore_rate > 0 && o.rescore_rate <= 1)) {
    fail("rl rescore rate {} is invalid (allowed: 0 < rate <= 1)", o.rescore_rate);
  }
  if (!(o.reassign_seconds > 0)) {
    fail("rl reassign seconds {} is invalid (allowed: > 0)", o.reassign_seconds);
  }
  if (o.step_timeout_seconds < 0) {
    fail("rl step timeout {} is invalid (allowed: >= 0; 0 = wait for every slot)",
         o.step_timeout_seconds);
  }
  if (o.max_slots_per_worker < 1) fail("rl max slots per worker 0 is invalid (allowed: >= 1)");
  if (o.max_workers < 1) fail("rl max workers {} is invalid (allowed: >= 1)", o.max_workers);
  if (o.checkpoint_every < 0) {
    fail("rl checkpoint every {} is invalid (allowed: 0 = at the end only, or >= 1 updates)",
         o.checkpoint_every);
  }
  if (!(o.worker_messages_per_second > 0) || o.worker_burst < 1) {
    fail("rl worker rate {}/s burst {} is invalid (allowed: rate > 0, burst >= 1)",
         o.worker_messages_per_second, o.worker_burst);
  }
  if (o.max_policy_bytes_in_flight < 1 || o.max_policy_bytes_per_worker < 1) {
    fail("rl policy bytes in flight {} / per worker {} are invalid (allowed: >= 1)",
         o.max_policy_bytes_in_flight, o.max_policy_bytes_per_worker);
  }
  if (o.run_id.empty() || o.run_id.size() > 200) {
    fail("rl run id '{}' is invalid (allowed: 1 to 200 characters)", o.run_id);
  }
}

GrpoTrainSummary serve_learner(LoadedCheckpoint base, const net::Identity& identity,
                               const LearnerOptions& options) {
  validate(options);
  learner_detail::Learner learner(std::move(base), identity, options);
  return learner.run();
}

}  // namespace agora
