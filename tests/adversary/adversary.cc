#include "adversary.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "agora/core/error.h"
#include "agora/core/hash.h"

namespace agora::adversary {
namespace {

std::string short_hex(const std::string& raw) {
  return net::short_key(raw);
}

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

Values values_of(const std::string& attack, double factor) {
  if (attack == "scale") return std::abs(factor) >= 1e38 ? Values::kFltMax : Values::kScale;
  if (attack == "sign-flip") return Values::kSignFlip;
  if (attack == "noise") return Values::kNoise;
  if (attack == "zero") return Values::kZero;
  return Values::kKeep;
}

}  // namespace

Adversary::Adversary(Options options)
    : o_(std::move(options)),
      report_(o_.attack),
      identity_(net::Identity::load(o_.key)),
      coordinator_key_(net::key_from_hex(o_.coordinator_key, "--coordinator-key")),
      rng_(o_.seed) {
  context_ = std::make_unique<net::Context>();
  server_ = std::make_unique<net::Server>(*context_, identity_, o_.listen, net::DecodeLimits{});
  endpoint_ = o_.advertise.empty() ? server_->bound_endpoint() : o_.advertise;
  const net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};
  coordinator_ = std::make_unique<net::Client>(*context_, identity_, o_.coordinator,
                                               coordinator_key_, control);
}

Adversary::~Adversary() {
  clients_.clear();
  coordinator_.reset();
  server_.reset();
  context_.reset();
}

double Adversary::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Adversary::run() {
  started_ = now();
  report_.emit("start", {{"key", short_hex(identity_.public_key())},
                         {"serving", server_->bound_endpoint()},
                         {"advertised", endpoint_}});
  while (!done_) {
    const double t = now();
    if (!joined_ && t - last_join_ > 5.0) send_join();  // as often as agora's peer
    std::vector<zmq::pollitem_t> items = {{server_->socket().handle(), 0, ZMQ_POLLIN, 0},
                                          {coordinator_->socket().handle(), 0, ZMQ_POLLIN, 0}};
    std::vector<std::string> endpoints;
    for (auto& [endpoint, client] : clients_) {
      items.push_back({client->socket().handle(), 0, ZMQ_POLLIN, 0});
      endpoints.push_back(endpoint);
    }
    const bool busy = o_.attack == "flood" && flood_start_ >= 0 && !flood_done_;
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(busy ? 0 : 5));
    while (auto in = server_->recv()) serve(std::move(*in));
    while (auto m = coordinator_->recv()) on_coordinator(*m);
    for (const std::string& endpoint : endpoints) {
      while (auto m = clients_.at(endpoint)->recv()) on_fetch_reply(endpoint, std::move(*m));
    }
    if (joined_) {
      heartbeat();
      commit_due();
      flood_tick();
      oversized();
      for (auto& [step, c] : collecting_) {
        bool all = true;
        for (const std::string& h : c.wanted)
          all = all && (c.held.contains(h) || c.failed.contains(h));
        if (!c.sent && (all || now() >= c.deadline)) witness(step);
      }
    }
    if (o_.duration > 0 && now() - started_ > o_.duration) {
      report_.emit("timeout", {{"seconds", o_.duration}});
      break;
    }
  }
  if (o_.attack == "flood" && flood_start_ >= 0 && !flood_done_) {
    // The run ended (or the adversary timed out) mid-flood: say what was sent all the same, so
    // a test waiting for the flood's end learns the run was too short rather than hanging.
    const double seconds = std::max(1e-9, now() - flood_start_);
    report_.emit("flood", {{"kind", o_.flood_kind},
                           {"sent", flood_sent_},
                           {"seconds", seconds},
                           {"per_second", double(flood_sent_) / seconds},
                           {"cut_short", true}});
  }
  report_.emit("summary", {{"finalized_steps", finalized_},
                           {"commits", own_.size()},
                           {"honest_payloads_fetched", honest_.size()},
                           {"requests_received", requests_},
                           {"served", served_},
                           {"withheld", withheld_},
                           {"flood_sent", flood_sent_}});
  return 0;
}

void Adversary::send_join() {
  wire::Envelope e;
  auto* j = e.mutable_join();
  j->set_key(identity_.public_key());
  j->set_endpoint(endpoint_);
  j->set_agent("agora-adversary (" + o_.attack + ")");
  coordinator_->send(e);
  last_join_ = now();
}

void Adversary::on_coordinator(const wire::Envelope& m) {
  if (m.has_welcome()) {
    if (!joined_) on_welcome(m.welcome());
  } else if (m.has_refused()) {
    report_.emit("refused",
                 {{"reason", m.refused().reason()}, {"may_rejoin", m.refused().may_rejoin()}});
    if (!m.refused().may_rejoin()) done_ = true;
    joined_ = false;
    last_join_ = -100;
  } else if (m.has_round_start()) {
    on_round_start(m.round_start());
  } else if (m.has_collect()) {
    on_collect(m.collect());
  } else if (m.has_finalized()) {
    on_finalized(m.finalized().step());
  } else if (m.has_resync()) {
    report_.emit("resync", {{"applied_steps", m.resync().state().applied_steps()}});
  } else if (m.has_finished()) {
    report_.emit("finished", {{"steps", m.finished().steps()}});
    done_ = true;
  }
}

// The run config, read by this build's schema. A coordinator built from a newer tree may send
// keys this one does not know: each is dropped (and said) rather than ending the attack, since
// the adversary needs only the model's shape, DeMo's geometry and a few network timings.
RunConfig Adversary::parse_config(std::string toml) {
  static const std::regex unknown("unknown key '([A-Za-z0-9_]+)\\.([A-Za-z0-9_]+)'");
  for (int attempt = 0;; ++attempt) {
    try {
      return RunConfig::parse(toml, "the coordinator's run config");
    } catch (const Error& e) {
      std::cmatch m;
      const std::string what = e.what();
      if (attempt > 50 || !std::regex_search(what.c_str(), m, unknown)) throw;
      const size_t section = toml.find("[" + m[1].str() + "]");
      const size_t key = toml.find("\n" + m[2].str() + " ", section);
      if (section == std::string::npos || key == std::string::npos) throw;
      toml.erase(key + 1, toml.find('\n', key + 1) - key);
      report_.emit("config_key_ignored", {{"key", m[1].str() + "." + m[2].str()}});
    }
  }
}

void Adversary::on_welcome(const wire::Welcome& w) {
  run_id_ = w.run_id();
  config_ = parse_config(w.run_config_toml());
  if (config_->model.vocab_size == 0) {
    if (o_.data.empty()) fail("the run config has no model.vocab_size: pass --data");
    std::ifstream f(o_.data + "/meta.json");
    config_->set_vocab_size(nlohmann::json::parse(f).at("vocab_size").get<int64_t>());
  }
  layout_ = demo_layout(*config_);
  finalized_ = w.finalized_steps();
  report_.finalized = finalized_;
  remember_members(w.holders());
  joined_ = true;
  joined_at_ = now();
  report_.emit("joined", {{"run", run_id_},
                          {"finalized_steps", finalized_},
                          {"endpoint", endpoint_},
                          {"tensors", layout_.tensors.size()},
                          {"one_bit", config_->demo.one_bit}});
  if (o_.attack == "forged-state") report_state(finalized_);
}

void Adversary::remember_members(const google::protobuf::RepeatedPtrField<wire::Member>& members) {
  for (const wire::Member& m : members) {
    if (m.key() != identity_.public_key()) members_[m.key()] = m.endpoint();
  }
}

void Adversary::heartbeat() {
  if (now() < next_heartbeat_) return;
  wire::Envelope e;
  e.mutable_heartbeat()->set_applied_steps(finalized_);
  e.mutable_heartbeat()->set_next_round(next_round_);
  coordinator_->send(e);
  next_heartbeat_ = now() + 1.0;
}

// ------------------------------------------------------------------------------ commits

Payload Adversary::base_for(uint64_t round) {
  if (!honest_.empty()) return decode_payload(blobs_.at(honest_.back().hash), layout_);
  return synthetic_payload(layout_, round, rng_);
}

std::string Adversary::payload_for(uint64_t round, std::string* what) {
  const std::string attack = round >= o_.from_round ? o_.attack : "copy";
  if (attack == "wrong-step") {
    const uint64_t claim = o_.claim_step >= 0 ? static_cast<uint64_t>(o_.claim_step)
                           : round > 0        ? round - 1
                                              : round + 1;
    *what = "wrong-step";
    return encode_payload(forge(base_for(round), claim, Values::kKeep, 1, rng_));
  }
  if (attack == "replay") {
    if (o_.replay_source == "own") {
      for (const auto& [r, hash] : own_) {
        if (r < round) {
          *what = fmt::format("replay of its own round {}", r);
          return blobs_.at(hash);
        }
      }
    } else {
      for (auto it = honest_.rbegin(); it != honest_.rend(); ++it) {
        if (it->step < round) {
          *what = fmt::format("replay of {}'s step {}", short_hex(it->author), it->step);
          return blobs_.at(it->hash);
        }
      }
    }
    *what = "copy (nothing to replay yet)";
    return encode_payload(forge(base_for(round), round, Values::kKeep, 1, rng_));
  }
  if (attack == "garbage") {
    // A payload cut in half: no witness can decode it (the old `--misbehave garbage-payload`).
    *what = "garbage";
    std::string bytes = encode_payload(forge(base_for(round), round, Values::kKeep, 1, rng_));
    bytes.resize(bytes.size() / 2);
    return bytes;
  }
  const Values v = values_of(attack, o_.factor);
  *what = v == Values::kKeep ? "copy" : attack;
  return encode_payload(forge(base_for(round), round, v, o_.factor, rng_));
}

void Adversary::commit(uint64_t round, const std::string& bytes, const std::string& what,
                       uint64_t seqs) {
  const std::string hash = blake2b256_bytes(bytes);
  blobs_[hash] = bytes;
  own_[round] = hash;
  wire::Envelope e;
  auto* c = e.mutable_commit();
  c->mutable_record()->set_author(identity_.public_key());
  c->mutable_record()->set_step(round);
  c->mutable_record()->set_payload_hash(hash);
  c->mutable_record()->set_signature(
      identity_.sign(net::commit_signing_bytes(run_id_, round, hash)));
  // It commits to strategy states it never had (a spot check of it fails: nobody serves them).
  c->set_strategy_before(random_bytes(rng_, 32));
  c->set_strategy_after(random_bytes(rng_, 32));
  c->set_trained_from(finalized_);
  c->set_strategy_signature(identity_.sign(net::strategy_signing_bytes(
      run_id_, round, hash, finalized_, c->strategy_before(), c->strategy_after())));
  c->set_sequences(seqs);
  c->set_compute_seconds(static_cast<double>(seqs) / o_.claim_throughput);
  c->set_loss(std::log(static_cast<double>(config_->model.vocab_size)));
  c->set_payload_bytes(bytes.size());
  coordinator_->send(e);
  commits_[round] = e;
  uint64_t payload_step = 0;
  try {
    payload_step = decode_payload(bytes).step;
  } catch (const Error&) {
  }
  report_.emit("commit", {{"round", round},
                          {"payload_step", payload_step},
                          {"hash", short_hex(hash)},
                          {"bytes", bytes.size()},
                          {"sequences", seqs},
                          {"what", what}});
}

void Adversary::on_round_start(const wire::RoundStart& r) {
  remember_members(r.members());
  if (r.step() < next_round_) {
    if (const auto it = commits_.find(r.step()); it != commits_.end())
      coordinator_->send(it->second);
    return;
  }
  next_round_ = r.step() + 1;
  uint64_t seqs = 0;
  for (const auto& range : r.assignment()) seqs += range.count();
  if (seqs == 0) return;
  // Shares follow when commits arrive, so it commits when a machine of the throughput it
  // claims would have finished (at once with a huge claim: the attack of taking the batch).
  due_[r.step()] = {now() + static_cast<double>(seqs) / o_.claim_throughput, seqs};
}

void Adversary::commit_due() {
  for (auto it = due_.begin(); it != due_.end();) {
    if (it->second.first > now()) {
      ++it;
      continue;
    }
    std::string what;
    const std::string bytes = payload_for(it->first, &what);
    commit(it->first, bytes, what, it->second.second);
    it = due_.erase(it);
  }
}

// ------------------------------------------------------------------------------ witnessing

net::Client& Adversary::client_for(const std::string& endpoint, const std::string& key) {
  auto& client = clients_[endpoint];
  if (!client) {
    client =
        std::make_unique<net::Client>(*context_, identity_, endpoint, key, net::DecodeLimits{});
  }
  return *client;
}

void Adversary::on_collect(const wire::Collect& c) {
  remember_members(c.members());
  if (collecting_.contains(c.step())) return;  // re-sent at a coordinator's resume
  Collecting& col = collecting_[c.step()];
  const double witness_seconds = config_->network.witness_seconds;
  col.deadline = now() + std::min(3.0, 0.5 * witness_seconds);
  for (const wire::CommitRecord& r : c.commits()) {
    col.authors[r.payload_hash()] = r.author();
    if (r.author() == identity_.public_key() || blobs_.contains(r.payload_hash())) {
      col.held.insert(r.payload_hash());
      continue;
    }
    col.wanted.insert(r.payload_hash());
    const auto m = members_.find(r.author());
    if (m == members_.end()) continue;
    wire::Envelope get;
    get.mutable_get_blob()->set_hash(r.payload_hash());
    client_for(m->second, m->first).send(get);
    asked_[r.payload_hash()] = {c.step(), now()};
  }
}

void Adversary::on_fetch_reply(const std::string& endpoint, wire::Envelope&& reply) {
  if (!reply.has_blob()) return;
  const std::string hash = reply.blob().hash();
  const auto asked = asked_.find(hash);
  if (asked == asked_.end()) return;  // a flood's answer, or a late one
  const uint64_t step = asked->second.first;
  asked_.erase(asked);
  auto col = collecting_.find(step);
  std::string data = std::move(*reply.mutable_blob()->mutable_data());
  if (blake2b256_bytes(data) != hash) return;
  if (!layout_checked_) {
    layout_checked_ = true;
    try {
      decode_payload(data, layout_);
      report_.emit("layout", {{"verified", true}, {"from", endpoint}});
    } catch (const Error& e) {
      // The torch-free layout is wrong for this model: take the honest payload's.
      try {
        const Payload p = decode_payload(data);
        layout_.tensors.clear();
        for (const TensorPayload& t : p.tensors) layout_.tensors.push_back(t.layout);
        report_.emit("layout", {{"verified", false}, {"error", e.what()}, {"from", endpoint}});
      } catch (const Error&) {
        return;
      }
    }
  }
  try {
    decode_payload(data, layout_);
  } catch (const Error& e) {
    report_.emit("invalid_payload", {{"step", step}, {"error", e.what()}});
    if (col != collecting_.end()) col->second.failed.insert(hash);
    return;
  }
  const std::string author = col != collecting_.end() ? col->second.authors[hash] : "";
  blobs_[hash] = std::move(data);
  if (col != collecting_.end()) col->second.held.insert(hash);
  if (std::find(o_.allies.begin(), o_.allies.end(), short_hex(author)) != o_.allies.end()) return;
  honest_.push_back({step, author, hash});
  while (honest_.size() > 256) {
    blobs_.erase(honest_.front().hash);
    honest_.erase(honest_.begin());
  }
}

void Adversary::witness(uint64_t step) {
  Collecting& col = collecting_.at(step);
  col.sent = true;
  const bool attacking = step >= o_.from_round;
  if (o_.silent || (attacking && o_.attack == "silent-witness")) {
    report_.emit("witness_withheld", {{"step", step}});
    return;
  }
  const bool lying = attacking && o_.attack == "lying-witness";
  wire::Envelope e;
  auto* w = e.mutable_witness();
  w->set_step(step);
  nlohmann::json rejected = nlohmann::json::array();
  size_t held = 0;
  for (const auto& [hash, author] : col.authors) {
    const bool own = author == identity_.public_key();
    if (own || (!lying && col.held.contains(hash))) {
      w->add_held(hash);
      ++held;
    } else {
      auto* r = w->add_rejected();
      r->set_author(author);
      r->set_reason(lying ? "the payload does not decode (adversary: a lie)"
                          : "no member could serve it");
      rejected.push_back(short_hex(author));
    }
  }
  coordinator_->send(e);
  report_.emit("witness",
               {{"step", step}, {"held", held}, {"rejected", rejected}, {"lying", lying}});
}

void Adversary::on_finalized(uint64_t step) {
  finalized_ = std::max(finalized_, step + 1);
  report_.finalized = finalized_;
  std::erase_if(collecting_,
                [&](const auto& item) { return item.first <= step && item.second.sent; });
  const auto k = static_cast<uint64_t>(std::max<int64_t>(1, config_->network.hash_interval));
  if (o_.attack == "forged-state" && finalized_ % k == 0 && step + 1 >= o_.from_round) {
    report_state(finalized_);
  }
}

// ------------------------------------------------------------------------------ serving

void Adversary::serve(net::Incoming&& in) {
  ++requests_;
  const wire::Envelope& m = in.message;
  wire::Envelope reply;
  if (m.has_get_blob()) {
    const std::string& hash = m.get_blob().hash();
    const bool own = std::any_of(own_.begin(), own_.end(),
                                 [&](const auto& item) { return item.second == hash; });
    if (o_.attack == "withhold" && own) {
      if (withheld_++ == 0 || withheld_ % 100 == 0) {
        report_.emit("withheld", {{"hash", short_hex(hash)}, {"requests", withheld_}});
      }
      return;  // no answer at all: the asker waits out its timeout
    }
    const auto it = blobs_.find(hash);
    if (it != blobs_.end()) {
      reply.mutable_blob()->set_hash(hash);
      reply.mutable_blob()->set_data(it->second);
      ++served_;
    } else {
      reply.mutable_not_found()->set_what(hash);
    }
  } else if (m.has_get_tensor()) {
    reply.mutable_not_found()->set_what(m.get_tensor().name());
  } else {
    return;
  }
  server_->send(in.route, reply);
}

// ------------------------------------------------------------------------------ state reports

void Adversary::report_state(uint64_t applied) {
  std::vector<uint64_t> counts;
  if (o_.state_mode == "huge") counts = {std::numeric_limits<uint64_t>::max() - 1};
  if (o_.state_mode == "evict") {
    for (uint64_t i = 1; i <= 4; ++i) counts.push_back(std::numeric_limits<uint64_t>::max() - i);
  }
  if (o_.state_mode == "empty" || o_.state_mode == "fake") counts = {applied};
  if (counts.empty()) fail("--state-mode {}: expected huge, evict, empty or fake", o_.state_mode);
  for (uint64_t k : counts) {
    wire::Envelope e;
    auto* s = e.mutable_state_report()->mutable_state();
    s->set_applied_steps(k);
    s->set_state_hash(random_bytes(rng_, 32));
    if (o_.state_mode != "empty") {
      for (const ParameterShape& p : parameter_shapes(config_->model)) {
        s->add_tensor_names(p.name);
        s->add_tensor_hashes(random_bytes(rng_, 32));
      }
    }
    coordinator_->send(e);
  }
  report_.emit("state_report", {{"mode", o_.state_mode}, {"applied_steps", counts}});
}

}  // namespace agora::adversary
