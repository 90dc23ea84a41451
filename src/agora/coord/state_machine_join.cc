// The state machine's joins: who may join, what a joiner is handed (the run, the state to load,
// its holders), and what a member that joins again keeps. (Entry points are in
// state_machine.cc.)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "agora/coord/state_machine.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/core/error.h"

namespace agora::coord {
using namespace detail;

void StateMachine::on_join(const net::PublicKey& from, const wire::Join& join, double now) {
  if (join.key() != from) {
    refuse(from, fmt::format("the join names key {} but the connection authenticated {}",
                             hex_for_log(join.key()), hex_for_log(from)));
    return;
  }
  if (!options_.allowlist.empty() && !options_.allowlist.contains(from)) {
    refuse(from, fmt::format("key {} is not on the allowlist of run {}", hex_for_log(from),
                             options_.run_id));
    return;
  }
  auto existing = state_.members.find(from);
  const bool rejoin = existing != state_.members.end();
  if (rejoin && existing->second.state == MemberState::kDropped &&
      barred(existing->second.drop_reason)) {
    refuse(from,
           fmt::format("{} was dropped from run {} for {}; it may not rejoin", short_hex(from),
                       options_.run_id, drop_text(existing->second.drop_reason)));
    return;
  }
  // Failed spot checks while it was not current (it left, or was dropped for silence): barred
  // all the same.
  if (spot_checks_.failures(from) >= options_.verify.max_failures && options_.verify.rate > 0) {
    refuse(from, fmt::format("{} failed {} spot checks in run {}; it may not rejoin",
                             short_hex(from), spot_checks_.failures(from), options_.run_id));
    return;
  }
  if (!valid_endpoint(join.endpoint())) {
    refuse(from, fmt::format("endpoint '{}' is not of the form tcp://host:port (port 1-65535)",
                             printable(join.endpoint())));
    return;
  }
  // Peers reach a member's payloads at its endpoint: a member advertising another's would make
  // that member's payloads unreachable (its fetchers ask the impostor). The owner may rejoin
  // with its own; a newcomer must wait until the holder is gone (dropped for silence, left).
  for (const auto& [key, other] : state_.members) {
    if (key != from && current(other) && same_endpoint(other.endpoint, join.endpoint())) {
      refuse(from,
             fmt::format("endpoint {} is already advertised by member {}; each member must "
                         "advertise an endpoint of its own",
                         printable(join.endpoint()), short_hex(key)),
             /*may_rejoin=*/true, "endpoint_taken");
      return;
    }
  }
  size_t current_members = 0;
  for (const auto& [key, other] : state_.members) {
    if (key != from && current(other)) ++current_members;
  }
  const size_t max_members = static_cast<size_t>(options_.network.max_members);
  if (current_members >= max_members) {
    refuse(from,
           fmt::format("run {} is full: {} current members (network.max_members = {})",
                       options_.run_id, current_members, max_members),
           /*may_rejoin=*/false, "full");
    return;
  }
  // Every other member is gone and the joiner does not hold the newest recorded state: nobody
  // can serve the parameters, so the run restarts from its newest checkpoint
  // (docs/architecture.md, "Joining, leaving, restarts"; docs/protocol.md section 10), or from
  // the initialisation when none was reported.
  bool others = false;
  for (const auto& [key, other] : state_.members)
    others = others || (key != from && current(other));
  const uint64_t newest = state_.state_reports.empty() ? 0 : state_.state_reports.rbegin()->first;
  // A fresh process (0 applied steps) holds nothing at all, whatever was reported.
  const bool holds_nothing = join.applied_steps() == 0 || join.applied_steps() < newest;
  if (!others && state_.finalized_steps() > 0 && holds_nothing) {
    restart_from_checkpoint();
  }
  std::vector<PublicKey> holders;
  const std::optional<StateRecord> state = newest_state(from, &holders);
  if (!state) {
    // Reports exist but a quorum stands behind none of them yet (members disagree, or the
    // newest steps are still being reported): handing out a record only some members vouch
    // for would let one of them feed joiners its own parameters.
    refuse(from,
           fmt::format("no state of run {} is vouched for by more than network.quorum = {} of "
                       "its {} active members yet; join again shortly",
                       options_.run_id, options_.network.quorum, active_count()),
           /*may_rejoin=*/true, "no_trusted_state");
    return;
  }
  // A current member joining again (its Welcome was lost, or it restarted) is in every member's
  // list already: telling them again would cost one message per member per retry, which at
  // hundreds of members feeds a storm of retries (docs/scaling.md).
  const bool was_current = rejoin && current(existing->second);
  MemberRecord& m = state_.members[from];
  members_changed();
  m.key = from;
  m.endpoint = join.endpoint();
  m.agent = printable(join.agent());
  // A measured throughput beats the joiner's own estimate, and the estimate, which nothing
  // checks, counts for no more than the fastest member delivers: a first share it cannot train
  // would stall a round until its deadline.
  double fastest = 0.0;
  for (const auto& [key, other] : state_.members) {
    if (key != from && other.state == MemberState::kActive) {
      fastest = std::max(fastest, other.sequences_per_second);
    }
  }
  double estimate = std::min(join.sequences_per_second(), kMaxJoinEstimate);
  if (fastest > 0.0) estimate = std::min(estimate, fastest);
  if (m.sequences_per_second == 0.0 && std::isfinite(estimate) && estimate > 0.0) {
    m.sequences_per_second = estimate;
  }
  if (!rejoin) m.strikes = 0;  // a rejoining member keeps its strikes
  if (rejoin) {
    act_on(spot_checks_.restarted(
        from, [&](const PublicKey& k) { return k != from && is_current(k); }, now));
  }
  m.drop_reason = DropReason::kNone;
  m.last_seen = now;
  m.joined_at = now;
  m.applied_steps = 0;  // unknown until it reports; a restarted peer may have lost its state
  m.checkpointer = false;
  int64_t checkpointers = 0;
  for (const auto& [key, other] : state_.members) {
    if (key != from && current(other) && other.checkpointer) ++checkpointers;
  }
  m.checkpointer = checkpointers < options_.network.checkpointers;
  // With nothing final yet there is nothing to catch up on.
  m.state = state_.finalized_steps() == 0 ? MemberState::kActive : MemberState::kSyncing;
  ++state_.counters.joins;

  wire::Envelope reply;
  wire::Welcome* welcome = reply.mutable_welcome();
  welcome->set_run_id(options_.run_id);
  welcome->set_run_config_toml(options_.run_config_toml);
  welcome->set_finalized_steps(state_.finalized_steps());
  to_wire(*state, welcome->mutable_state());
  add_members(welcome->mutable_holders(), holders);
  welcome->set_checkpointer(m.checkpointer);
  send(from, std::move(reply));
  // Peers' servers answer only members the coordinator listed to them (protocol.md, "Peers'
  // servers"): tell them about the joiner now, not at the next RoundStart.
  if (!was_current) {
    wire::Envelope admit;
    add_members(admit.mutable_admit()->mutable_joining(), {from});
    for (const auto& [key, other] : state_.members) {
      if (key != from && current(other)) send(key, admit);
    }
  }
  log(EventKind::kJoin,
      fmt::format("{} {} ({}) at {} as {}{}; {} active", short_hex(from),
                  rejoin ? "rejoined" : "joined", m.agent, m.endpoint, to_string(m.state),
                  m.checkpointer ? ", checkpointer" : "", active_count()),
      &from);
}

}  // namespace agora::coord
