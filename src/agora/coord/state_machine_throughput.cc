// The state machine's measure of its members: throughput from commits, on time or late, and when
// each commit of a round arrived.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/net/identity.h"

namespace agora::coord {
using namespace detail;

namespace {

// One sample into a member's throughput EMA (weight 1/2; the first sample stands alone).
// `claimed` is the member's own compute_seconds: it can only make the sample slower (a member
// that waited before training still says how long training took). Returns false when the
// numbers make no sample.
bool measure(MemberRecord& member, uint64_t sequences, double seen, double claimed) {
  const double seconds = std::isfinite(claimed) && claimed > seen ? claimed : std::max(seen, 1e-3);
  if (!std::isfinite(seconds)) return false;
  const double sample = static_cast<double>(sequences) / seconds;
  if (!std::isfinite(sample) || sample <= 0.0) return false;
  double& sps = member.sequences_per_second;
  sps = sps == 0.0 ? sample : 0.5 * sps + 0.5 * sample;
  return true;
}

}  // namespace

// A member's throughput decides its share of the next rounds, so it is what the coordinator
// saw it deliver, not what it says: the sequences over the seconds from the round's opening to
// its commit, on the coordinator's clock. Claiming more speed than it has therefore buys
// nothing: a member is as fast as its commits arrive, and a commit that arrives fast because the
// work was not done is what spot checks catch.
void StateMachine::update_throughput(MemberRecord& member, const OpenRound& round,
                                     const wire::Commit& commit, double now) {
  commit_times_.emplace_back(now - round.opened_at, member.key);
  // The sequences it was handed, not the count it says it trained.
  measure(member, total_count(round.assignments.at(member.key)), now - round.opened_at,
          commit.compute_seconds());
}

void StateMachine::remember_missed(const MemberRecord& member, const OpenRound& round) {
  std::vector<MissedRound>& missed = missed_[member.key];
  if (missed.size() >= kMissedRoundsKept) missed.erase(missed.begin());
  missed.push_back({round.step, round.opened_at, total_count(round.assignments.at(member.key))});
}

// A late commit arrived after a deadline that allowed deadline_factor times the share's expected
// time, so its sample is below the speed the member was measured at: it can only make the
// member look slower, which hands it fewer sequences (and no longer deadline: the split keeps
// every member's expected time within the round's). A member gains nothing by sending one; each
// missed round counts once, so repeats do nothing. The signature must verify, so a sample is
// taken only from a commit the member stands behind, as with an on-time one.
std::optional<double> StateMachine::learn_from_late_commit(MemberRecord& member,
                                                           const wire::Commit& commit, double now) {
  auto it = missed_.find(member.key);
  if (it == missed_.end()) return std::nullopt;
  const wire::CommitRecord& record = commit.record();
  std::vector<MissedRound>& missed = it->second;
  auto round = std::find_if(missed.begin(), missed.end(),
                            [&](const MissedRound& m) { return m.step == record.step(); });
  if (round == missed.end()) return std::nullopt;
  if (record.payload_hash().size() != kHashBytes ||
      !net::verify_signature(
          member.key,
          net::commit_signing_bytes(options_.run_id, record.step(), record.payload_hash()),
          record.signature())) {
    return std::nullopt;
  }
  const MissedRound m = *round;
  missed.erase(round);
  if (missed.empty()) missed_.erase(it);
  if (!measure(member, m.sequences, now - m.opened_at, commit.compute_seconds())) {
    return std::nullopt;
  }
  // It was working, only slower than it had been measured: the strike its round gave is taken
  // back, or a volunteer slower than the minimum deadline would be dropped before the rounds
  // that use its measurement come. A member late on purpose gains nothing from it: each late
  // sample cuts its measured speed, and so its share, to less than (1 + 1 / deadline_factor) / 2
  // of what it was, so the data it holds up shrinks every round.
  if (member.strikes > 0) --member.strikes;
  return member.sequences_per_second;
}

// What the close of `round` logs about its commits' timing: the round's length, the median and
// the last commit's arrival (seconds from the opening) and who sent the last one, so a long round
// names what held it. Only the length when no commit was timed (none arrived, or the
// coordinator restarted while the round was open).
std::vector<obs::LogField> StateMachine::commit_timing(const OpenRound& round, double now) const {
  std::vector<obs::LogField> fields{{"seconds", now - round.opened_at}};
  if (commit_times_.empty()) return fields;
  std::vector<double> times;
  times.reserve(commit_times_.size());
  for (const auto& [seconds, key] : commit_times_) times.push_back(seconds);
  std::sort(times.begin(), times.end());
  fields.push_back({"median_commit_seconds", times[times.size() / 2]});
  fields.push_back({"last_commit_seconds", commit_times_.back().first});
  fields.push_back({"last_committer", short_hex(commit_times_.back().second)});
  return fields;
}

}  // namespace agora::coord
