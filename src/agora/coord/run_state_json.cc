#include "agora/coord/run_state_json.h"

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/core/list_bits.h"

namespace agora::coord {

using nlohmann::json;

namespace {

// Keys, hashes and signatures travel as hex.
std::string bytes_from(const json& hex) {
  return hex_decode(hex.get<std::string>(), "a key or hash of the saved run state");
}

json ranges_json(const std::vector<SequenceRange>& ranges) {
  json out = json::array();
  for (const SequenceRange& r : ranges) out.push_back({r.first, r.count});
  return out;
}

std::vector<SequenceRange> ranges_from(const json& j) {
  std::vector<SequenceRange> out;
  for (const json& r : j) out.push_back({r.at(0).get<uint64_t>(), r.at(1).get<uint64_t>()});
  return out;
}

json commit_json(const CommitRecord& c) {
  return {{"author", hex_encode(c.author)},
          {"step", c.step},
          {"payload_hash", hex_encode(c.payload_hash)},
          {"signature", hex_encode(c.signature)}};
}

CommitRecord commit_from(const json& j) {
  return {bytes_from(j.at("author")), j.at("step").get<uint64_t>(),
          bytes_from(j.at("payload_hash")), bytes_from(j.at("signature"))};
}

json keys_json(const std::set<PublicKey>& keys) {
  json out = json::array();
  for (const PublicKey& k : keys) out.push_back(hex_encode(k));
  return out;
}

std::set<PublicKey> keys_from(const json& j) {
  std::set<PublicKey> out;
  for (const json& k : j) out.insert(bytes_from(k));
  return out;
}

json assignments_json(const std::map<PublicKey, std::vector<SequenceRange>>& m) {
  json out = json::array();
  for (const auto& [key, ranges] : m) out.push_back({hex_encode(key), ranges_json(ranges)});
  return out;
}

std::map<PublicKey, std::vector<SequenceRange>> assignments_from(const json& j) {
  std::map<PublicKey, std::vector<SequenceRange>> out;
  for (const json& e : j) out[bytes_from(e.at(0))] = ranges_from(e.at(1));
  return out;
}

// Every counter once, by its name in the JSON. Those added after the first release may be
// absent from a database written before them, and read as 0.
struct CounterField {
  const char* name;
  uint64_t Counters::*field;
  bool may_be_absent;
};

constexpr CounterField kCounterFields[] = {
    {"joins", &Counters::joins, false},
    {"refusals", &Counters::refusals, false},
    {"leaves", &Counters::leaves, false},
    {"drops", &Counters::drops, false},
    {"strikes", &Counters::strikes, false},
    {"rounds_opened", &Counters::rounds_opened, false},
    {"commits_accepted", &Counters::commits_accepted, false},
    {"commits_rejected", &Counters::commits_rejected, false},
    {"commits_late", &Counters::commits_late, false},
    {"witnesses", &Counters::witnesses, false},
    {"rejections_reported", &Counters::rejections_reported, false},
    {"payloads_final", &Counters::payloads_final, false},
    {"payloads_not_final", &Counters::payloads_not_final, false},
    {"resyncs_sent", &Counters::resyncs_sent, false},
    {"restarts", &Counters::restarts, true},
    {"deadline_misses", &Counters::deadline_misses, true},  // added with the metrics (issue 7)
    {"checkpoints", &Counters::checkpoints, true},          // likewise
    // Added with issue 13's limits; older databases lack them.
    {"checkpoints_refused", &Counters::checkpoints_refused, true},
    {"state_reports_refused", &Counters::state_reports_refused, true},
    {"witnesses_repeated", &Counters::witnesses_repeated, true},
    {"witness_disagreements", &Counters::witness_disagreements, true},
    {"events_suppressed", &Counters::events_suppressed, true},
    {"events", &Counters::events, false},
};

json counters_json(const Counters& c) {
  json out = json::object();
  for (const CounterField& f : kCounterFields) out[f.name] = c.*f.field;
  return out;
}

Counters counters_from(const json& j) {
  Counters c;
  for (const CounterField& f : kCounterFields) {
    c.*f.field = f.may_be_absent ? j.value(f.name, uint64_t{0}) : j.at(f.name).get<uint64_t>();
  }
  return c;
}

}  // namespace

json core_json(const RunState& s) {
  return {
      {"split", 1},
      {"phase", static_cast<int>(s.phase)},
      {"phase_since", s.phase_since},
      {"next_step", s.next_step},
      {"queue", {{"pending", ranges_json(s.queue.pending)}, {"next_fresh", s.queue.next_fresh}}},
      {"counters", counters_json(s.counters)}};
}

bool is_split(const json& j) {
  return j.contains("split");
}

void core_from(const json& j, RunState& s) {
  const int phase = j.at("phase").get<int>();
  if (phase < 0 || phase > static_cast<int>(Phase::kFinished)) fail("phase {} is unknown", phase);
  s.phase = static_cast<Phase>(phase);
  s.phase_since = j.at("phase_since");
  s.next_step = j.at("next_step");
  s.queue.pending = ranges_from(j.at("queue").at("pending"));
  s.queue.next_fresh = j.at("queue").at("next_fresh");
  s.counters = counters_from(j.at("counters"));
}

json round_header_json(const OpenRound& r) {
  return {{"step", r.step},
          {"apply_through", r.apply_through},
          {"report_state", r.report_state},
          {"opened_at", r.opened_at},
          {"deadline", r.deadline},
          {"assignments", assignments_json(r.assignments)}};
}

OpenRound round_header_from(const json& r) {
  OpenRound round;
  round.step = r.at("step");
  round.apply_through = r.at("apply_through");
  round.report_state = r.at("report_state");
  round.opened_at = r.at("opened_at");
  round.deadline = r.at("deadline");
  round.assignments = assignments_from(r.at("assignments"));
  return round;
}

json collecting_header_json(const CollectingStep& c) {
  json commits = json::array();
  for (const CommitRecord& r : c.commits) commits.push_back(commit_json(r));
  return {{"step", c.step},
          {"commits", commits},
          {"ranges", assignments_json(c.ranges)},
          {"expected", keys_json(c.expected)},
          {"deadline", c.deadline}};
}

CollectingStep collecting_header_from(const json& c) {
  CollectingStep step;
  step.step = c.at("step");
  for (const json& r : c.at("commits")) step.commits.push_back(commit_from(r));
  step.ranges = assignments_from(c.at("ranges"));
  step.expected = keys_from(c.at("expected"));
  step.deadline = c.at("deadline");
  return step;
}

// The whole in-flight state as one value, as files written before the split hold it: the parts
// below, with the round's commits and each step's witnesses and holders inside them.
json volatile_json(const RunState& s) {
  json j = core_json(s);
  j.erase("split");
  if (s.round) {
    json round = round_header_json(*s.round);
    json commits = json::array();
    for (const auto& [key, c] : s.round->commits) commits.push_back(commit_json(c));
    round["commits"] = commits;
    j["round"] = round;
  } else {
    j["round"] = nullptr;
  }
  json collecting = json::array();
  for (const auto& [step, c] : s.collecting) {
    json one = collecting_header_json(c);
    // As those files hold it: the witnesses' keys, and payload hash -> the witnesses holding it.
    std::set<PublicKey> witnesses;
    std::map<std::string, std::set<PublicKey>> holding;
    for (const auto& [key, bits] : c.witnessed) {
      witnesses.insert(key);
      for (size_t i = 0; i < c.commits.size(); ++i) {
        if (list_bit(bits, i)) holding[c.commits[i].payload_hash].insert(key);
      }
    }
    json holders = json::array();
    for (const auto& [hash, keys] : holding) holders.push_back({hex_encode(hash), keys_json(keys)});
    one["witnessed"] = keys_json(witnesses);
    one["holders"] = holders;
    collecting.push_back(one);
  }
  j["collecting"] = collecting;
  return j;
}

void volatile_from(const json& j, RunState& s) {
  core_from(j, s);
  const json& r = j.at("round");
  if (!r.is_null()) {
    OpenRound round = round_header_from(r);
    for (const json& c : r.at("commits")) {
      CommitRecord record = commit_from(c);
      round.commits[record.author] = std::move(record);
    }
    s.round = std::move(round);
  }
  for (const json& c : j.at("collecting")) {
    CollectingStep step = collecting_header_from(c);
    for (const PublicKey& key : keys_from(c.at("witnessed"))) {
      step.witnessed[key] = list_bits(step.commits.size());
    }
    for (const json& h : c.at("holders")) {
      const std::string hash = bytes_from(h.at(0));
      for (size_t i = 0; i < step.commits.size(); ++i) {
        if (step.commits[i].payload_hash != hash) continue;
        for (const PublicKey& key : keys_from(h.at(1))) {
          auto witness = step.witnessed.find(key);
          if (witness != step.witnessed.end()) set_list_bit(witness->second, i);
        }
      }
    }
    const uint64_t t = step.step;
    s.collecting[t] = std::move(step);
  }
}

}  // namespace agora::coord
