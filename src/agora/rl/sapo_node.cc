#include "agora/rl/sapo_node.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/net/allowlist.h"
#include "agora/obs/event_log.h"
#include "agora/rl/group_batch.h"
#include "agora/rl/held_out.h"
#include "agora/rl/sampling.h"
#include "agora/rl/sapo_draw.h"
#include "agora/serve/poll.h"
#include "agora/serve/rate_gate.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

// Rounds whose groups the node keeps to answer peers that are behind.
constexpr size_t kRoundsKept = 8;

// One group as this node holds it, its own or a peer's.
struct Group {
  Problem problem;
  std::vector<TokenId> prompt;
  std::vector<std::vector<TokenId>> completions;
  bool informative = false;
};

class Node {
 public:
  Node(LoadedCheckpoint base, const net::Identity& identity, const SapoNodeOptions& o);
  SapoNodeSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  bool stopped() const { return o_.stop && o_.stop->load(); }
  void log(nlohmann::json row);
  // Answers what peers asked, waiting up to `ms` for the first request.
  void serve(int ms);
  std::vector<Group> sample_own(int64_t round, double& reward);
  void publish(int64_t round, const std::vector<Group>& groups);
  // The peers' groups of `round`, as many as came within share_wait_seconds.
  std::vector<Group> gather(int64_t round, int64_t& received);
  // Why a peer's reply is refused (a short reason), or nullopt; fills `out` when accepted.
  std::optional<std::string> check(const wire::SapoGroups& reply, uint64_t round,
                                   std::vector<Group>& out) const;
  bool informative(const Group& g) const;

  SapoNodeOptions o_;
  LoadedCheckpoint base_;
  Llama& model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TokenId eot_;
  std::unique_ptr<Task> task_;
  torch::optim::AdamW optimizer_;
  net::Context context_;
  net::Server server_;
  std::vector<std::unique_ptr<net::Client>> peers_;
  serve::RateGate peer_rates_;  // by curve key: only the peers may connect
  std::map<int64_t, std::shared_ptr<const std::string>> published_;  // round -> SapoGroups bytes
  int64_t newest_ = 0;
  bool finished_ = false;
  uint64_t cursor_;  // where this node's problems come from
  obs::EventLog log_;
  SapoNodeSummary summary_;
  const Clock::time_point started_ = Clock::now();
};

net::Admission peers_only(const std::vector<SapoPeer>& peers) {
  std::set<net::PublicKey> keys;
  for (const SapoPeer& p : peers) keys.insert(p.key);
  return net::admission_of(keys);
}

net::DecodeLimits sapo_limits() {
  net::DecodeLimits limits;
  limits.max_data = net::kMaxControlBytes;  // groups travel as control messages
  return limits;
}

Node::Node(LoadedCheckpoint base, const net::Identity& identity, const SapoNodeOptions& o)
    : o_(o),
      base_(std::move(base)),
      model_(base_.model),
      tokenizer_(load_tokenizer(base_.tokenizer_spec)),
      eot_(static_cast<TokenId>(base_.meta.eot_id)),
      task_(make_task(o.task_name, o.task)),
      optimizer_(model_->parameters(),
                 torch::optim::AdamWOptions(o.sapo.lr).betas({0.9, 0.99}).weight_decay(0.0)),
      context_(peers_only(o.peers)),
      server_(context_, identity, o.listen, sapo_limits(), /*reply_queue=*/256),
      peer_rates_({o.peer_requests_per_second, o.peer_burst}, {}),
      // Nodes draw their problems from different places of the training split.
      cursor_(stable_hash64(identity.public_key()) % (uint64_t{1} << 40)) {
  for (const SapoPeer& p : o_.peers) {
    peers_.push_back(std::make_unique<net::Client>(context_, identity, p.endpoint, p.key,
                                                   sapo_limits(), /*receive_queue=*/64));
  }
  std::filesystem::create_directories(o_.out);
  log_ = obs::EventLog(o_.out / "sapo.jsonl", /*append=*/false, [this] { return now(); });
  log({{"event", "sapo_node"},
       {"key", net::key_to_hex(identity.public_key())},
       {"listen", server_.bound_endpoint()},
       {"peers", o_.peers.size()},
       {"behaviour", o_.behaviour}});
}

void Node::log(nlohmann::json row) {
  log_.write(std::move(row));
}

void Node::serve(int ms) {
  serve::wait_readable(server_.socket(), std::chrono::milliseconds(ms));
  serve::drain(server_, {}, [this](const net::Incoming& in) {
    if (!in.message.has_sapo_get_groups()) return;
    // Only the peers may connect (the handshake's allowlist), so each has a budget of its own.
    if (!peer_rates_.take(in.curve_key, /*member=*/true, now())) return;
    const auto asked = static_cast<int64_t>(
        std::min<uint64_t>(in.message.sapo_get_groups().round(), static_cast<uint64_t>(INT64_MAX)));
    const auto it = published_.find(asked);
    if (it != published_.end()) {
      server_.send_shared(in.route, it->second, std::make_shared<std::atomic<int64_t>>(0));
      return;
    }
    wire::Envelope e;  // not there yet (or forgotten): the newest round it has
    e.mutable_sapo_groups()->set_round(static_cast<uint64_t>(newest_));
    e.mutable_sapo_groups()->set_finished(finished_);
    server_.send(in.route, e);
  });
}

bool Node::informative(const Group& g) const {
  std::vector<double> rewards;
  for (const auto& c : g.completions)
    rewards.push_back(task_->reward(g.problem, completion_text(*tokenizer_, c)));
  return rewards_differ(rewards);
}

std::vector<Group> Node::sample_own(int64_t round, double& reward) {
  std::vector<Group> groups;
  double sum = 0;
  for (int64_t j = 0; j < o_.sapo.own; ++j) {
    Group g;
    g.problem = task_->next(cursor_, /*want_held_out=*/o_.behaviour == "held-out");
    g.prompt = tokenizer_->encode(g.problem.prompt);
    CompletionSampling sampling;
    sampling.count = o_.sapo.group_size;
    sampling.max_new_tokens = o_.sapo.max_new_tokens;
    sampling.temperature = o_.sapo.temperature;
    sampling.seed = sapo_mix(
        o_.sapo.seed ^ sapo_mix(static_cast<uint64_t>(round) << 24 ^ static_cast<uint64_t>(j)));
    for (Completion& c : sample_completions(model_, eot_, g.prompt, sampling)) {
      sum += task_->reward(g.problem, completion_text(*tokenizer_, c.tokens));
      g.completions.push_back(std::move(c.tokens));
    }
    g.informative = informative(g);
    groups.push_back(std::move(g));
  }
  reward = sum / static_cast<double>(o_.sapo.own * o_.sapo.group_size);
  return groups;
}

void Node::publish(int64_t round, const std::vector<Group>& groups) {
  wire::Envelope e;
  auto* reply = e.mutable_sapo_groups();
  reply->set_round(static_cast<uint64_t>(round));
  const int copies = o_.behaviour == "flood" ? 8 : 1;
  for (int copy = 0; copy < copies; ++copy) {
    for (const Group& g : groups) {
      auto* group = reply->add_groups();
      group->set_problem_id(g.problem.id);
      for (const auto& c : g.completions) {
        auto* completion = group->add_completions();
        if (o_.behaviour == "garbage") {
          completion->add_tokens(static_cast<uint32_t>(model_->config().vocab_size) + 5);
        } else if (o_.behaviour == "held-out") {
          for (TokenId t : tokenizer_->encode(g.problem.solution)) completion->add_tokens(t);
          completion->add_tokens(eot_);
        } else {
          for (TokenId t : c) completion->add_tokens(t);
        }
      }
    }
  }
  published_[round] = std::make_shared<const std::string>(net::encode_envelope(e));
  while (published_.size() > kRoundsKept) published_.erase(published_.begin());
  newest_ = round;
}

std::optional<std::string> Node::check(const wire::SapoGroups& reply, uint64_t round,
                                       std::vector<Group>& out) const {
  if (reply.round() != round) return "round";
  if (reply.groups_size() > o_.max_groups_per_reply) return "too_many_groups";
  const auto vocab = static_cast<uint32_t>(model_->config().vocab_size);
  std::vector<Group> groups;
  for (const auto& g : reply.groups()) {
    Group group;
    group.problem = task_->make(g.problem_id());
    if (task_->held_out(group.problem)) return "held_out";
    if (g.completions_size() != o_.sapo.group_size) return "group_size";
    for (const auto& c : g.completions()) {
      if (c.tokens_size() == 0) return "empty";
      if (c.tokens_size() > o_.sapo.max_new_tokens) return "too_long";
      std::vector<TokenId> tokens;
      for (uint32_t t : c.tokens()) {
        if (t >= vocab) return "bad_token";
        tokens.push_back(static_cast<TokenId>(t));
      }
      group.completions.push_back(std::move(tokens));
    }
    group.prompt = tokenizer_->encode(group.problem.prompt);
    group.informative = informative(group);
    groups.push_back(std::move(group));
  }
  out = std::move(groups);
  return std::nullopt;
}

std::vector<Group> Node::gather(int64_t round, int64_t& received) {
  std::vector<Group> theirs;
  std::vector<bool> done(peers_.size(), false);
  std::vector<double> asked(peers_.size(), -1);
  const double until = now() + o_.share_wait_seconds;
  size_t open = peers_.size();
  while (open > 0 && now() < until && !stopped()) {
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (done[i] || now() - asked[i] < 0.5) continue;  // ask again twice a second
      wire::Envelope e;
      e.mutable_sapo_get_groups()->set_round(static_cast<uint64_t>(round));
      peers_[i]->send(e);
      asked[i] = now();
    }
    serve(20);
    for (size_t i = 0; i < peers_.size(); ++i) {
      while (std::optional<wire::Envelope> m = peers_[i]->recv()) {
        if (done[i] || !m->has_sapo_groups()) continue;
        const wire::SapoGroups& reply = m->sapo_groups();
        if (reply.round() != static_cast<uint64_t>(round)) {
          // Not there yet (a peer that has finished never will be), past the rounds it keeps,
          // or a late answer to an earlier round's question.
          const bool never = reply.finished() || reply.round() > static_cast<uint64_t>(round);
          if (reply.groups_size() == 0 && never) {
            done[i] = true;
            --open;
          }
          continue;
        }
        std::vector<Group> groups;
        if (const auto why = check(reply, static_cast<uint64_t>(round), groups)) {
          ++summary_.refused[*why];
          log({{"event", "sapo_node_refused"},
               {"peer", o_.peers[i].endpoint},
               {"round", round},
               {"reason", *why}});
        } else {
          const auto kept = std::min<size_t>(groups.size(), static_cast<size_t>(o_.sapo.own));
          if (groups.size() > kept) {
            summary_.capped += static_cast<int64_t>(groups.size() - kept);
            log({{"event", "sapo_node_capped"},
                 {"peer", o_.peers[i].endpoint},
                 {"round", round},
                 {"sent", groups.size()},
                 {"kept", kept}});
            groups.resize(kept);
          }
          received += static_cast<int64_t>(groups.size());
          for (Group& g : groups) theirs.push_back(std::move(g));
        }
        done[i] = true;
        --open;
      }
    }
  }
  return theirs;
}

SapoNodeSummary Node::run() {
  summary_.base_accuracy =
      score_held_out(model_, *tokenizer_, *task_, o_.sapo.eval_problems, o_.sapo.max_new_tokens)
          .accuracy();
  log({{"event", "sapo_node_start"}, {"held_out_accuracy", summary_.base_accuracy}});
  for (int64_t round = 1; round <= o_.sapo.rounds && !stopped(); ++round) {
    double reward = 0;
    const std::vector<Group> mine = sample_own(round, reward);
    publish(round, mine);
    int64_t received = 0;
    std::vector<Group> theirs;
    if (o_.sapo.shared > 0) theirs = gather(round, received);
    std::vector<bool> informative;
    for (const Group& g : theirs) informative.push_back(g.informative);
    std::vector<const Group*> chosen;
    for (const Group& g : mine) chosen.push_back(&g);
    const std::vector<size_t> drawn =
        draw_shared(informative, o_.sapo.shared,
                    sapo_mix(o_.sapo.seed ^ 0x5A90 ^ static_cast<uint64_t>(round) << 16));
    for (size_t i : drawn) chosen.push_back(&theirs[i]);
    const auto used = static_cast<int64_t>(drawn.size());
    GroupBatch batch;
    for (const Group* g : chosen) {
      std::vector<Sample> samples;
      for (const auto& c : g->completions) samples.push_back({c, {}});
      add_group(batch, *task_, *tokenizer_, g->problem, g->prompt, std::move(samples),
                o_.sapo.grpo);
    }
    const GrpoLoss update = grpo_update(model_, optimizer_, eot_, batch, o_.sapo.temperature,
                                        o_.sapo.grad_clip, o_.sapo.grpo);
    summary_.cumulative_reward += reward;
    summary_.shared_received += received;
    summary_.shared_used += used;
    summary_.rounds = round;
    log({{"event", "sapo_node_round"},
         {"round", round},
         {"reward", reward},
         {"cumulative_reward", summary_.cumulative_reward},
         {"shared_received", received},
         // Received groups whose rewards differ: the only ones a shared slot may take.
         {"shared_informative", std::count(informative.begin(), informative.end(), true)},
         {"shared_used", used},
         // Groups in this round's GRPO update (own and shared), and whether it stepped.
         {"update_groups", batch.rewards.size()},
         {"update_skipped", update.skipped},
         {"refused", summary_.refused}});
    if (o_.progress) {
      fmt::print(stderr,
                 "sapo node: round {}/{}  reward {:.3f}  cumulative {:.2f}  shared {} of {}\n",
                 round, o_.sapo.rounds, reward, summary_.cumulative_reward, used, received);
    }
  }
  finished_ = true;
  const double linger_until = now() + o_.linger_seconds;
  while (now() < linger_until && !stopped()) serve(50);
  summary_.accuracy =
      score_held_out(model_, *tokenizer_, *task_, o_.sapo.eval_problems, o_.sapo.max_new_tokens)
          .accuracy();
  summary_.seconds = now();
  log({{"event", "sapo_node_summary"},
       {"rounds", summary_.rounds},
       {"cumulative_reward", summary_.cumulative_reward},
       {"base_accuracy", summary_.base_accuracy},
       {"accuracy", summary_.accuracy},
       {"shared_received", summary_.shared_received},
       {"shared_used", summary_.shared_used},
       {"refused", summary_.refused},
       {"capped", summary_.capped},
       {"seconds", summary_.seconds}});
  return summary_;
}

}  // namespace

SapoPeer parse_sapo_peer(const std::string& text) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos || at == 0 || text.rfind("tcp://", 0) != 0) {
    fail("--peer '{}' is not of the form tcp://HOST:PORT@PUBLIC_KEY_HEX", text);
  }
  return {text.substr(0, at), net::key_from_hex(text.substr(at + 1), "--peer key")};
}

void validate(const SapoNodeOptions& o) {
  SapoOptions sapo = o.sapo;
  sapo.nodes = 2;  // validated through its peers instead
  validate(sapo);
  if (o.peers.empty()) fail("a sapo node needs at least one --peer to share with");
  if (!(o.share_wait_seconds > 0)) {
    fail("sapo share wait {} is invalid (allowed: > 0 seconds)", o.share_wait_seconds);
  }
  if (o.linger_seconds < 0) fail("sapo linger {} is invalid (allowed: >= 0)", o.linger_seconds);
  if (o.sapo.own > o.max_groups_per_reply) {
    fail("sapo own groups {} exceeds the {} a reply may hold", o.sapo.own, o.max_groups_per_reply);
  }
  if (o.behaviour != "honest" && o.behaviour != "garbage" && o.behaviour != "held-out" &&
      o.behaviour != "flood") {
    fail("--behave {} is not known (allowed: honest, garbage, held-out, flood)", o.behaviour);
  }
}

SapoNodeSummary run_sapo_node(LoadedCheckpoint base, const net::Identity& identity,
                              const SapoNodeOptions& options) {
  validate(options);
  if (base.tokenizer_spec.empty()) fail("the base checkpoint names no tokenizer");
  Node node(std::move(base), identity, options);
  return node.run();
}

}  // namespace agora
