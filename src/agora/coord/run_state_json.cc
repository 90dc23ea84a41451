#include "agora/coord/run_state_json.h"

#include "agora/core/error.h"

namespace agora::coord {

using nlohmann::json;

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail("'{}' is not lower-case hexadecimal", hex);
  };
  if (hex.size() % 2 != 0) fail("'{}' has an odd number of hexadecimal digits", hex);
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return out;
}

namespace {

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
  return {{"author", to_hex(c.author)},
          {"step", c.step},
          {"payload_hash", to_hex(c.payload_hash)},
          {"signature", to_hex(c.signature)}};
}

CommitRecord commit_from(const json& j) {
  return {from_hex(j.at("author").get<std::string>()), j.at("step").get<uint64_t>(),
          from_hex(j.at("payload_hash").get<std::string>()),
          from_hex(j.at("signature").get<std::string>())};
}

json keys_json(const std::set<PublicKey>& keys) {
  json out = json::array();
  for (const PublicKey& k : keys) out.push_back(to_hex(k));
  return out;
}

std::set<PublicKey> keys_from(const json& j) {
  std::set<PublicKey> out;
  for (const json& k : j) out.insert(from_hex(k.get<std::string>()));
  return out;
}

json assignments_json(const std::map<PublicKey, std::vector<SequenceRange>>& m) {
  json out = json::array();
  for (const auto& [key, ranges] : m) out.push_back({to_hex(key), ranges_json(ranges)});
  return out;
}

std::map<PublicKey, std::vector<SequenceRange>> assignments_from(const json& j) {
  std::map<PublicKey, std::vector<SequenceRange>> out;
  for (const json& e : j) out[from_hex(e.at(0).get<std::string>())] = ranges_from(e.at(1));
  return out;
}

json counters_json(const Counters& c) {
  return {{"joins", c.joins},
          {"refusals", c.refusals},
          {"leaves", c.leaves},
          {"drops", c.drops},
          {"strikes", c.strikes},
          {"rounds_opened", c.rounds_opened},
          {"commits_accepted", c.commits_accepted},
          {"commits_rejected", c.commits_rejected},
          {"commits_late", c.commits_late},
          {"witnesses", c.witnesses},
          {"rejections_reported", c.rejections_reported},
          {"payloads_final", c.payloads_final},
          {"payloads_not_final", c.payloads_not_final},
          {"resyncs_sent", c.resyncs_sent},
          {"restarts", c.restarts},
          {"deadline_misses", c.deadline_misses},
          {"checkpoints", c.checkpoints},
          {"events", c.events}};
}

Counters counters_from(const json& j) {
  Counters c;
  c.joins = j.at("joins");
  c.refusals = j.at("refusals");
  c.leaves = j.at("leaves");
  c.drops = j.at("drops");
  c.strikes = j.at("strikes");
  c.rounds_opened = j.at("rounds_opened");
  c.commits_accepted = j.at("commits_accepted");
  c.commits_rejected = j.at("commits_rejected");
  c.commits_late = j.at("commits_late");
  c.witnesses = j.at("witnesses");
  c.rejections_reported = j.at("rejections_reported");
  c.payloads_final = j.at("payloads_final");
  c.payloads_not_final = j.at("payloads_not_final");
  c.resyncs_sent = j.at("resyncs_sent");
  c.restarts = j.value("restarts", uint64_t{0});
  // Added with the metrics (issue 7): databases written before lack them.
  c.deadline_misses = j.value("deadline_misses", uint64_t{0});
  c.checkpoints = j.value("checkpoints", uint64_t{0});
  c.events = j.at("events");
  return c;
}

}  // namespace

json volatile_json(const RunState& s) {
  json j;
  j["phase"] = static_cast<int>(s.phase);
  j["phase_since"] = s.phase_since;
  j["next_step"] = s.next_step;
  if (s.round) {
    const OpenRound& r = *s.round;
    json commits = json::array();
    for (const auto& [key, c] : r.commits) commits.push_back(commit_json(c));
    j["round"] = {{"step", r.step},
                  {"apply_through", r.apply_through},
                  {"report_state", r.report_state},
                  {"opened_at", r.opened_at},
                  {"deadline", r.deadline},
                  {"assignments", assignments_json(r.assignments)},
                  {"commits", commits}};
  } else {
    j["round"] = nullptr;
  }
  json collecting = json::array();
  for (const auto& [step, c] : s.collecting) {
    json commits = json::array();
    for (const CommitRecord& r : c.commits) commits.push_back(commit_json(r));
    json holders = json::array();
    for (const auto& [hash, keys] : c.holders) holders.push_back({to_hex(hash), keys_json(keys)});
    collecting.push_back({{"step", c.step},
                          {"commits", commits},
                          {"ranges", assignments_json(c.ranges)},
                          {"expected", keys_json(c.expected)},
                          {"witnessed", keys_json(c.witnessed)},
                          {"holders", holders},
                          {"deadline", c.deadline}});
  }
  j["collecting"] = collecting;
  j["queue"] = {{"pending", ranges_json(s.queue.pending)}, {"next_fresh", s.queue.next_fresh}};
  j["counters"] = counters_json(s.counters);
  return j;
}

void volatile_from(const json& j, RunState& s) {
  const int phase = j.at("phase").get<int>();
  if (phase < 0 || phase > static_cast<int>(Phase::kFinished)) fail("phase {} is unknown", phase);
  s.phase = static_cast<Phase>(phase);
  s.phase_since = j.at("phase_since");
  s.next_step = j.at("next_step");
  const json& r = j.at("round");
  if (!r.is_null()) {
    OpenRound round;
    round.step = r.at("step");
    round.apply_through = r.at("apply_through");
    round.report_state = r.at("report_state");
    round.opened_at = r.at("opened_at");
    round.deadline = r.at("deadline");
    round.assignments = assignments_from(r.at("assignments"));
    for (const json& c : r.at("commits")) {
      CommitRecord record = commit_from(c);
      round.commits[record.author] = std::move(record);
    }
    s.round = std::move(round);
  }
  for (const json& c : j.at("collecting")) {
    CollectingStep step;
    step.step = c.at("step");
    for (const json& r2 : c.at("commits")) step.commits.push_back(commit_from(r2));
    step.ranges = assignments_from(c.at("ranges"));
    step.expected = keys_from(c.at("expected"));
    step.witnessed = keys_from(c.at("witnessed"));
    for (const json& h : c.at("holders")) {
      step.holders[from_hex(h.at(0).get<std::string>())] = keys_from(h.at(1));
    }
    step.deadline = c.at("deadline");
    s.collecting[step.step] = std::move(step);
  }
  s.queue.pending = ranges_from(j.at("queue").at("pending"));
  s.queue.next_fresh = j.at("queue").at("next_fresh");
  s.counters = counters_from(j.at("counters"));
}

}  // namespace agora::coord
