// The state machine's hash reports and checkpoints: what a member says its parameters are, what
// a joiner is handed, and who is told to resync; and what the service found out about members
// (their reachability, coord/relay.h), and going back to a checkpoint when nobody holds the
// parameters. (Entry points are in state_machine.cc.)
//
// A state report is evidence, never trusted alone: it is refused unless it could have come from
// an honest peer (its step final, on the report schedule, a consistent tensor list), and a
// record is handed to a joiner or used for a Resync only when more than network.quorum x the
// active members reported its hash (trusted_record).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/core/hash.h"

namespace agora::coord {
using namespace detail;

namespace {

// The first thing wrong with a report's tensor list, or "" when there is nothing. `reason`
// receives a short code for the log's "reason" key.
std::string record_problem(const wire::StateRecord& s, std::string* reason) {
  *reason = "malformed";
  if (s.state_hash().size() != kHashBytes) {
    return fmt::format("the state hash has {} bytes; expected {}", s.state_hash().size(),
                       kHashBytes);
  }
  if (s.tensor_names_size() == 0) return "it lists no tensor";
  if (s.tensor_names_size() != s.tensor_hashes_size()) {
    return fmt::format("it names {} tensors but hashes {}", s.tensor_names_size(),
                       s.tensor_hashes_size());
  }
  if (static_cast<size_t>(s.tensor_names_size()) > kMaxStateTensors) {
    return fmt::format("it lists {} tensors; at most {} are allowed", s.tensor_names_size(),
                       kMaxStateTensors);
  }
  std::set<std::string_view> names;
  std::string all;
  for (int i = 0; i < s.tensor_names_size(); ++i) {
    const std::string& name = s.tensor_names(i);
    if (name.empty() || name.size() > kMaxTensorNameChars || printable(name) != name) {
      return fmt::format(
          "tensor {} has an empty, overlong or unprintable name (allowed: 1-{} "
          "printable ASCII characters)",
          i, kMaxTensorNameChars);
    }
    if (!names.insert(name).second) return fmt::format("tensor '{}' is listed twice", name);
    if (s.tensor_hashes(i).size() != kHashBytes) {
      return fmt::format("tensor '{}' has a {}-byte hash; expected {}", name,
                         s.tensor_hashes(i).size(), kHashBytes);
    }
    all += s.tensor_hashes(i);
  }
  // docs/protocol.md section 2: the state hash is the BLAKE2b-256 of the tensor hashes in order.
  if (blake2b256_bytes(all) != s.state_hash()) {
    *reason = "inconsistent";
    return "its state hash is not the BLAKE2b-256 of its tensor hashes";
  }
  return "";
}

}  // namespace

void StateMachine::on_state_report(MemberRecord& member, const wire::StateReport& report) {
  const wire::StateRecord& s = report.state();
  const uint64_t k = s.applied_steps();
  const uint64_t final_steps = state_.finalized_steps();
  const uint64_t interval = static_cast<uint64_t>(options_.network.hash_interval);
  auto& reports = state_.state_reports;
  std::string reason = "ahead", problem;
  if (k > final_steps) {
    problem = fmt::format("only {} steps are final", final_steps);
  } else if (k % interval != 0 && !reports.contains(k)) {
    // Peers report at multiples of hash_interval, and after loading a state they were handed
    // (Welcome, Resync), whose step is one kept here.
    reason = "off_schedule";
    problem = fmt::format(
        "{} is not a multiple of network.hash_interval = {} nor a state handed "
        "out",
        k, interval);
  } else if (!reports.contains(k) && reports.size() >= kMaxStateReportSteps &&
             k < reports.begin()->first) {
    reason = "too_old";
    problem = "it is older than every step kept";
  } else {
    problem = record_problem(s, &reason);
  }
  if (!problem.empty()) {
    ++state_.counters.state_reports_refused;
    log(EventKind::kIgnored,
        fmt::format("ignored a state report from {} for {} applied steps: {}",
                    short_hex(member.key), k, problem),
        &member.key, {{"reason", reason}, {"applied_steps", k}});
    return;
  }
  member.applied_steps = std::max(member.applied_steps, k);
  mark_caught_up(member);
  HashReports& r = reports[k];
  r.reported[member.key] = s.state_hash();
  // The first full record naming a hash is kept; a checkpoint's stand-in (no tensor list, see
  // restart_from_checkpoint) gives way to the first member that loaded it and reported in full.
  const auto known = r.records.find(s.state_hash());
  if (known == r.records.end() || known->second.tensor_names.empty()) {
    StateRecord record;
    record.applied_steps = k;
    record.state_hash = s.state_hash();
    record.tensor_names.assign(s.tensor_names().begin(), s.tensor_names().end());
    record.tensor_hashes.assign(s.tensor_hashes().begin(), s.tensor_hashes().end());
    r.records[s.state_hash()] = std::move(record);
  }
  // A record nobody reports any more (its reporter changed its mind) is dropped: records are
  // at most one per reporter, whatever a member sends.
  std::set<std::string> reported;
  for (const auto& [key, hash] : r.reported) reported.insert(hash);
  std::erase_if(r.records, [&](const auto& item) { return !reported.contains(item.first); });
  while (reports.size() > kMaxStateReportSteps) reports.erase(reports.begin());
  if (reports.contains(k)) check_hashes(k);
}

void StateMachine::on_checkpoint_report(MemberRecord& member, const wire::CheckpointReport& report,
                                        double now) {
  const uint64_t k = report.applied_steps();
  std::string problem, reason = "malformed";
  if (report.state_hash().size() != kHashBytes) {
    problem = fmt::format("the state hash has {} bytes, expected {}", report.state_hash().size(),
                          kHashBytes);
  } else if (!member.checkpointer) {
    reason = "not_checkpointer";
    problem = "it was not asked to write checkpoints";
  } else if (k > state_.finalized_steps()) {
    reason = "ahead";
    problem = fmt::format("only {} steps are final", state_.finalized_steps());
  } else {
    std::vector<PublicKey> holders;
    const StateRecord* trusted = trusted_record(k, nullptr, &holders);
    if (trusted && trusted->state_hash != report.state_hash()) {
      // A restart would hand this hash to every joiner; it must be the run's state at k.
      reason = "wrong_hash";
      problem = fmt::format("state {} is not {}, what a quorum reported after {} steps",
                            short_hex(report.state_hash()), short_hex(trusted->state_hash), k);
    }
  }
  if (!problem.empty()) {
    ++state_.counters.checkpoints_refused;
    log(EventKind::kIgnored,
        fmt::format("ignored a checkpoint report from {} after {} steps: {}", short_hex(member.key),
                    k, problem),
        &member.key, {{"reason", reason}, {"applied_steps", k}});
    return;
  }
  ++state_.counters.checkpoints;
  auto& list = state_.checkpoints;
  // The run's checkpoint before this one; every multiple of train.checkpoint_interval between
  // the two was written by nobody (its checkpointer was gone, or jumped over it by fetching a
  // newer state): the operator hears of it once, here.
  uint64_t previous = 0;
  for (const CheckpointRecord& c : list) {
    if (c.applied_steps < k) previous = std::max(previous, c.applied_steps);
  }
  const uint64_t every = options_.checkpoint_interval;
  if (every > 0 && k > previous) {
    const uint64_t first = previous / every + 1, last = (k - 1) / every;  // multiples in (prev, k)
    if (last >= first) {
      log(EventKind::kCheckpoint,
          fmt::format("checkpoint gap: no checkpoint after {} steps{}; the run's checkpoints go "
                      "from {} to {} (train.checkpoint_interval = {})",
                      first * every,
                      last > first ? fmt::format(" .. {} ({} missing)", last * every, last - first + 1)
                                   : std::string(),
                      previous, k, every),
          nullptr,
          {{"reason", "gap"}, {"missing", last - first + 1}, {"from", previous}, {"to", k}});
    }
  }
  // A report of the same step by the same member replaces the earlier one.
  std::erase_if(list, [&](const CheckpointRecord& c) {
    return c.reporter == member.key && c.applied_steps == k;
  });
  list.push_back(
      CheckpointRecord{k, report.state_hash(), printable(report.path(), 1024), member.key, now});
  if (list.size() > kMaxCheckpoints) list.erase(list.begin());
  log(EventKind::kCheckpoint,
      fmt::format("{} wrote a checkpoint after {} steps (state {}) to {}", short_hex(member.key), k,
                  short_hex(report.state_hash()), list.back().path),
      &member.key);
}

const StateRecord* StateMachine::trusted_record(uint64_t applied_steps, const PublicKey* except,
                                                std::vector<PublicKey>* holders) const {
  holders->clear();
  const auto it = state_.state_reports.find(applied_steps);
  if (it == state_.state_reports.end() || it->second.reported.empty()) return nullptr;
  const HashReports& r = it->second;
  std::map<std::string, size_t> counts;
  size_t support = 0;
  const std::string majority = majority_hash(r, &counts, &support);
  size_t active = 0;
  for (const auto& [key, m] : state_.members) {
    if (m.state == MemberState::kActive && (except == nullptr || key != *except)) ++active;
  }
  // Reporters that left still count: they held that state when they said so. With nobody
  // active (every member left) the newest record stands on its own.
  if (static_cast<double>(support) <= options_.network.quorum * static_cast<double>(active)) {
    return nullptr;
  }
  for (const auto& [key, hash] : r.reported) {
    const auto m = state_.members.find(key);
    if (hash == majority && m != state_.members.end() && m->second.state == MemberState::kActive &&
        (except == nullptr || key != *except)) {
      holders->push_back(key);
    }
  }
  const auto record = r.records.find(majority);
  return record != r.records.end() ? &record->second : nullptr;
}

std::optional<StateRecord> StateMachine::newest_state(const PublicKey& joiner,
                                                      std::vector<PublicKey>* holders) const {
  holders->clear();
  if (state_.state_reports.empty()) return StateRecord{};  // nothing reported: the seed's
  for (auto it = state_.state_reports.rbegin(); it != state_.state_reports.rend(); ++it) {
    if (const StateRecord* record = trusted_record(it->first, &joiner, holders)) return *record;
  }
  // Before any step is final the state is the seed's, which every peer computes itself.
  if (state_.finalized_steps() == 0) return StateRecord{};
  return std::nullopt;
}

void StateMachine::check_hashes(uint64_t applied_steps) {
  HashReports& r = state_.state_reports.at(applied_steps);
  std::vector<PublicKey> holders;
  // A Resync makes its receiver load the record: only one a quorum stands behind.
  const StateRecord* trusted = trusted_record(applied_steps, nullptr, &holders);
  if (trusted == nullptr) return;
  const StateRecord majority = *trusted;
  std::map<std::string, size_t> counts;
  size_t best = 0;
  majority_hash(r, &counts, &best);
  for (const auto& [key, hash] : r.reported) {
    if (counts[hash] >= best || r.resynced.contains(key)) continue;
    if (!is_current(key)) continue;
    wire::Envelope message;
    wire::Resync* resync = message.mutable_resync();
    to_wire(majority, resync->mutable_state());
    add_members(resync->mutable_holders(), holders);
    send(key, std::move(message));
    r.resynced.insert(key);
    ++state_.counters.resyncs_sent;
    log(EventKind::kResync,
        fmt::format("{} reported state {} after {} steps; the majority ({} of {}) has {}: resync",
                    short_hex(key), short_hex(hash), applied_steps, best, r.reported.size(),
                    short_hex(majority.state_hash)),
        &key);
  }
}

void StateMachine::restart_from_checkpoint() {
  spot_checks_.forget_open();
  const uint64_t final_steps = state_.finalized_steps();
  const CheckpointRecord* best = nullptr;
  for (const CheckpointRecord& c : state_.checkpoints) {
    if (c.applied_steps <= final_steps && (!best || c.applied_steps > best->applied_steps))
      best = &c;
  }
  const uint64_t to = best ? best->applied_steps : 0;
  if (state_.round) {
    for (const auto& [key, ranges] : state_.round->assignments)
      return_sequences(state_.queue, ranges);
    state_.round.reset();
  }
  for (const auto& [step, collecting] : state_.collecting) {
    for (const auto& [key, ranges] : collecting.ranges) return_sequences(state_.queue, ranges);
  }
  state_.collecting.clear();
  state_.finalized.resize(to);
  state_.next_step = to;
  std::erase_if(state_.state_reports, [&](const auto& item) { return item.first >= to; });
  if (best) {
    // The checkpoint's writer stands for its hash until someone loads it and reports.
    HashReports& reports = state_.state_reports[to];
    reports.records[best->state_hash] = StateRecord{to, best->state_hash, {}, {}};
    reports.reported[best->reporter] = best->state_hash;
  }
  if (state_.phase == Phase::kTraining) set_phase(Phase::kPaused, state_.phase_since);
  ++state_.counters.restarts;
  log(EventKind::kRestart, fmt::format("no member holds the parameters: the run restarts from {} "
                                       "after step {} (steps {}..{} are "
                                       "undone; their data is not trained again)",
                                       best ? fmt::format("the checkpoint {} wrote to {}",
                                                          short_hex(best->reporter), best->path)
                                            : std::string("the initialisation"),
                                       to, to, final_steps - 1),
      nullptr, {{"to_step", to}});
}

// ---- what the service found out about members --------------------------------------------------

void StateMachine::set_probing(const PublicKey& key) {
  std::erase_if(strike_free_below_, [&](const auto& item) { return !is_current(item.first); });
  strike_free_below_[key] = std::numeric_limits<uint64_t>::max();
}

}  // namespace agora::coord
