// The state machine's rounds: phases, opening, closing and finalizing, strikes and drops.
// (Entry points and message handlers are in state_machine.cc.)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/core/error.h"
#include "agora/core/list_bits.h"

namespace agora::coord {
using namespace detail;

// ---- progress ----------------------------------------------------------------------------------

void StateMachine::progress(double now) {
  // Each pass may enable the next (a close finalizes a step, which opens a round); the loop ends
  // when a pass changes nothing. Every change consumes a round or a step, so it terminates.
  keep_checkpointers();
  for (int pass = 0; pass < 1000 && state_.phase != Phase::kFinished; ++pass) {
    if (state_.finalized_steps() >= options_.total_steps) {
      finish();
      return;
    }
    const size_t active = active_count();
    const size_t min_peers = static_cast<size_t>(options_.network.min_peers);
    const Phase before = state_.phase;
    const uint64_t rounds_before = state_.counters.rounds_opened;
    const uint64_t next_before = state_.next_step;
    const uint64_t final_before = state_.finalized_steps();
    switch (state_.phase) {
      case Phase::kWaitingForPeers:
        if (active >= min_peers) set_phase(Phase::kWarmup, now);
        break;
      case Phase::kWarmup:
        if (active < min_peers) {
          set_phase(Phase::kWaitingForPeers, now);
        } else if (now >= state_.phase_since + options_.network.warmup_seconds) {
          set_phase(Phase::kTraining, now);
        }
        break;
      case Phase::kPaused:
        if (active >= min_peers) set_phase(Phase::kTraining, now);
        break;
      case Phase::kTraining:
      case Phase::kFinished:
        break;
    }
    if (state_.round) {
      // Close early once everyone the round still waits for has committed.
      bool all_in = true;
      for (const auto& [key, ranges] : state_.round->assignments) {
        const MemberRecord& m = state_.members.at(key);
        if (m.state == MemberState::kActive && total_count(ranges) > 0 &&
            !state_.round->commits.contains(key)) {
          all_in = false;
          break;
        }
      }
      if (all_in) close_round(now);
    }
    finalize_ready(now);
    if (state_.finalized_steps() >= options_.total_steps) continue;  // finishes next pass
    const uint64_t overlap = static_cast<uint64_t>(options_.network.overlap);
    if (state_.phase == Phase::kTraining && !state_.round &&
        state_.next_step < options_.total_steps &&
        state_.finalized_steps() + overlap >= state_.next_step) {
      if (active_count() < min_peers) {
        set_phase(Phase::kPaused, now);
      } else {
        open_round(now);
      }
    }
    if (state_.phase == before && state_.counters.rounds_opened == rounds_before &&
        state_.next_step == next_before && state_.finalized_steps() == final_before) {
      return;
    }
  }
}

void StateMachine::set_phase(Phase phase, double now) {
  const Phase before = state_.phase;
  state_.phase = phase;
  state_.phase_since = now;
  log(EventKind::kPhase, fmt::format("phase {} -> {} ({} active, min_peers {})", to_string(before),
                                     to_string(phase), active_count(), options_.network.min_peers));
}

void StateMachine::open_round(double now) {
  const uint64_t t = state_.next_step;
  round_start_healed_.clear();
  members_changed();
  const std::vector<const MemberRecord*> members = active_members();
  std::vector<double> measured;
  std::vector<uint64_t> checking;  // what each is still recomputing for spot checks
  for (const MemberRecord* m : members) {
    measured.push_back(m->sequences_per_second);
    checking.push_back(spot_checks_.sequences_newly_asked_of(m->key));
  }
  spot_checks_.round_opened();
  // "even": every member counts as equally fast, so the split depends on the members alone.
  const std::vector<double> weights = options_.network.split == "even"
                                          ? std::vector<double>(members.size(), 1.0)
                                          : throughput_weights(measured);
  const std::vector<uint64_t> shares = fastest_shares(
      options_.batch_size, weights_after_checks(weights, options_.batch_size, checking));
  const std::vector<SequenceRange> ids = take_sequences(state_.queue, options_.batch_size);
  const std::vector<std::vector<SequenceRange>> pieces = cut_ranges(ids, shares);

  OpenRound round;
  round.step = t;
  const uint64_t overlap = static_cast<uint64_t>(options_.network.overlap);
  round.apply_through = t >= overlap ? t - overlap : 0;
  round.report_state = t % static_cast<uint64_t>(options_.network.hash_interval) == 0;
  round.opened_at = now;
  commit_times_.clear();
  // The slowest expected compute time; members of unknown speed do not stretch it (they are
  // given a median share and the minimum covers them).
  double slowest = 0.0;
  std::string split;
  for (size_t i = 0; i < members.size(); ++i) {
    const double sps = members[i]->sequences_per_second;
    if (sps > 0.0) slowest = std::max(slowest, static_cast<double>(shares[i]) / sps);
    round.assignments[members[i]->key] = pieces[i];
    split += fmt::format("{}{}={}", i ? " " : "", short_hex(members[i]->key), shares[i]);
  }
  const double seconds =
      std::max(options_.network.min_deadline_seconds, options_.network.deadline_factor * slowest);
  round.deadline = now + seconds;
  state_.round = std::move(round);
  ++state_.counters.rounds_opened;
  const auto common = round_start_common();
  for (const MemberRecord* m : members) send_round_start(m->key, now, common);
  log(EventKind::kRound,
      fmt::format("round {} opened: {} sequences to {} members ({}), deadline {:.1f} s", t,
                  options_.batch_size, members.size(), split, seconds),
      nullptr, {{"round", t}, {"deadline_seconds", seconds}});
  if (t == options_.tst_switch_step && t > 0) {
    log(EventKind::kTstSwitch,
        fmt::format("step {}: token superposition ends; next-token training from here on", t),
        nullptr, {{"round", t}});
  }
}

void StateMachine::close_round(double now) {
  OpenRound round = std::move(*state_.round);
  state_.round.reset();
  state_.next_step = round.step + 1;
  CollectingStep step;
  step.step = round.step;
  std::vector<std::string> missed;
  for (const auto& [key, ranges] : round.assignments) {
    auto commit = round.commits.find(key);
    if (commit != round.commits.end()) {
      step.commits.push_back(commit->second);
      step.ranges[key] = ranges;
      continue;
    }
    // No commit: the data goes back to the queue, handed out first next round.
    return_sequences(state_.queue, ranges);
    if (total_count(ranges) == 0) continue;  // nothing was asked of it
    MemberRecord& m = state_.members.at(key);
    missed.push_back(short_hex(key));
    ++state_.counters.deadline_misses;
    // A member that left or restarted (rejoined, now syncing) walked out; no strike.
    if (m.state == MemberState::kActive) {
      strike(m, fmt::format("missed the deadline of round {}", round.step));
      if (current(m)) remember_missed(m, round);
    }
  }
  std::erase_if(missed_, [&](const auto& entry) { return !is_current(entry.first); });
  for (const MemberRecord* m : active_members()) step.expected.insert(m->key);
  log(EventKind::kRound,
      fmt::format("round {} closed: {} of {} committed{}{}", round.step, step.commits.size(),
                  round.assignments.size(), missed.empty() ? "" : "; no commit from ",
                  fmt::join(missed, ", ")),
      nullptr, [&] {
        std::vector<obs::LogField> fields{{"round", round.step}};
        for (obs::LogField& f : commit_timing(round, now)) fields.push_back(std::move(f));
        return fields;
      }());
  if (step.commits.empty()) {
    step.deadline = now;  // nothing to witness: final as soon as the steps before it are
  } else {
    step.deadline = now + options_.network.witness_seconds;
    const auto collect = std::make_shared<const wire::Envelope>(collect_for(step));
    for (const PublicKey& key : step.expected) send(key, collect);
  }
  draw_spot_checks(round, step, now);
  state_.collecting[step.step] = std::move(step);
}

void StateMachine::finalize_ready(double now) {
  while (!state_.collecting.empty()) {
    CollectingStep& step = state_.collecting.begin()->second;
    if (step.step != state_.finalized_steps()) {
      fail("coordinator bug: step {} is collecting but {} steps are final", step.step,
           state_.finalized_steps());
    }
    bool ready = step.commits.empty() || now >= step.deadline;
    if (!ready) {
      ready = true;  // every expected witness still active has reported
      for (const PublicKey& key : step.expected) {
        const MemberRecord& m = state_.members.at(key);
        if (m.state == MemberState::kActive && !step.witnessed.contains(key)) {
          ready = false;
          break;
        }
      }
    }
    if (!ready) return;
    finalize(step);
    state_.collecting.erase(state_.collecting.begin());
  }
}

void StateMachine::finalize(CollectingStep& step) {
  const size_t expected = step.expected.size();
  const double quorum = options_.network.quorum;
  std::vector<CommitRecord> final_set;
  // Per commit, the witnesses that said they hold it: one pass over each witness's bits, so a
  // step costs members^2 bit tests rather than members^2 set lookups.
  std::vector<size_t> holding(step.commits.size(), 0);
  size_t witnesses = 0;  // expected members that answered
  for (const auto& [key, bits] : step.witnessed) {
    if (!step.expected.contains(key)) continue;
    ++witnesses;
    for (size_t i = 0; i < step.commits.size(); ++i) holding[i] += list_bit(bits, i);
  }
  for (size_t i = 0; i < step.commits.size(); ++i) {
    const CommitRecord& c = step.commits[i];
    // The author's own claim never counts as evidence: only the other witnesses'. Of those,
    // `others` were expected, `answered` sent their Witness, `held` listed the payload.
    const bool author_expected = step.expected.contains(c.author);
    const auto own = step.witnessed.find(c.author);
    const bool author_answered = author_expected && own != step.witnessed.end();
    const size_t others = expected - (author_expected ? 1 : 0);
    const size_t answered = witnesses - (author_answered ? 1 : 0);
    const size_t held = holding[i] - (author_answered && list_bit(own->second, i) ? 1 : 0);
    const size_t missing = answered - held;
    // Final when (a) more than quorum x the witnesses that answered hold it, so a payload the
    // answering majority could not get is never applied however many liars vouch for it, and
    // (b) as before, more than quorum x all expected witnesses hold it, the author included, so
    // silence alone cannot let a lone vouching witness through. A run with nobody else to
    // witness (one member) trusts its single member.
    const bool is_final =
        others == 0 ||
        (held > 0 && static_cast<double>(held) > quorum * static_cast<double>(answered) &&
         static_cast<double>(held + 1) > quorum * static_cast<double>(expected));
    // Witnesses whose report the outcome contradicts, for the operator to see.
    state_.counters.witness_disagreements += is_final ? missing : held;
    auto member = state_.members.find(c.author);
    if (is_final) {
      final_set.push_back(c);
      ++state_.counters.payloads_final;
      if (member != state_.members.end()) member->second.strikes = 0;
      continue;
    }
    ++state_.counters.payloads_not_final;
    return_sequences(state_.queue, step.ranges[c.author]);
    // A strike needs a strict majority of the other expected witnesses to report the payload
    // missing: one lying witness cannot strike an honest author in a run of three or more, and
    // silent witnesses accuse nobody.
    const auto free = strike_free_below_.find(c.author);
    const bool excused = free != strike_free_below_.end() && step.step < free->second;
    if (2 * missing > others && member != state_.members.end() && current(member->second) &&
        !excused) {
      strike(member->second,
             fmt::format("its payload for step {} was missing for {} of the {} other witnesses "
                         "(held by {}; quorum {})",
                         step.step, missing, others, held, quorum));
    } else {
      log(EventKind::kRejection,
          fmt::format("{}'s payload for step {} is not final: held by {} of the {} other "
                      "witnesses that answered ({} expected; quorum {}); no strike",
                      short_hex(c.author), step.step, held, answered, others, quorum),
          &c.author,
          {{"reason", "not_final"},
           {"for_step", step.step},
           {"held", held},
           {"answered", answered}});
    }
  }
  // Witnesses hold the step's Collect: they hear which of its commits are final, one bit each.
  // The others (a member that joined or caught up since) hear the whole set.
  auto whole = std::make_shared<wire::Envelope>();
  wire::Finalized* f = whole->mutable_finalized();
  f->set_step(step.step);
  for (const CommitRecord& c : final_set) to_wire(c, f->add_set());
  auto bits = std::make_shared<wire::Envelope>();
  bits->mutable_finalized()->set_step(step.step);
  std::string* of_collect = bits->mutable_finalized()->mutable_of_collect();
  *of_collect = list_bits(step.commits.size());
  for (size_t i = 0, j = 0; i < step.commits.size() && j < final_set.size(); ++i) {
    if (!(step.commits[i] == final_set[j])) continue;
    set_list_bit(*of_collect, i);
    ++j;
  }
  state_.finalized.push_back(std::move(final_set));
  for (const MemberRecord* m : active_members(true)) {
    send(m->key, step.expected.contains(m->key) ? bits : whole);
  }
  // The sequence ids the step trained, for an audit of the data against the queue.
  std::vector<SequenceRange> trained;
  for (const CommitRecord& c : state_.finalized.back()) {
    const auto& r = step.ranges[c.author];
    trained.insert(trained.end(), r.begin(), r.end());
  }
  log(EventKind::kRound, fmt::format("step {} final: {} of {} payloads, {} of {} witnesses",
                                     step.step, state_.finalized.back().size(), step.commits.size(),
                                     step.witnessed.size(), expected),
      nullptr, {{"round", step.step}, {"final", true}, {"trained", format_ranges(trained)}});
}

void StateMachine::finish() {
  set_phase(Phase::kFinished, now_);
  finished_at_ = now_;
  keep_checkpointers();
  log(EventKind::kPhase,
      fmt::format("run {} finished: {} steps final", options_.run_id, state_.finalized_steps()),
      nullptr,
      {{"finished", true},
       {"next_fresh", state_.queue.next_fresh},
       {"pending", format_ranges(state_.queue.pending)}});
  for (const MemberRecord* m : active_members(true)) send(m->key, finished_for(*m));
  maybe_release(now_);
}

wire::Envelope StateMachine::finished_for(const MemberRecord& member) const {
  wire::Envelope message;
  wire::Finished* f = message.mutable_finished();
  f->set_steps(state_.finalized_steps());
  f->set_checkpointer(member.checkpointer);
  f->set_linger(!released_);
  return message;
}

void StateMachine::handle_finished(MemberRecord& member, const wire::Envelope& message,
                                   double now) {
  member.last_seen = now;
  bool repeat = false;
  switch (message.body_case()) {
    case wire::Envelope::kHeartbeat:
      record_applied(member, message.heartbeat().applied_steps());
      // A member done applying waits for Finished: it hears it again (it may have been lost, or
      // the role it holds changed), at the pace of its heartbeats.
      repeat = member.applied_steps >= state_.finalized_steps();
      break;
    case wire::Envelope::kGetFinalized:
      on_get_finalized(member, message.get_finalized());
      break;
    case wire::Envelope::kCheckpointReport:
      on_checkpoint_report(member, message.checkpoint_report(), now);
      break;
    case wire::Envelope::kStateReport:
      on_state_report(member, message.state_report());
      break;
    case wire::Envelope::kLeave:
      on_leave(member);
      keep_checkpointers();
      break;
    default:
      repeat = true;  // a commit or witness from a member that missed it
  }
  const bool was_released = released_;
  maybe_release(now);
  // A release just now told every current member already.
  if (repeat && released_ == was_released && current(member)) {
    send(member.key, finished_for(member));
  }
}

void StateMachine::maybe_release(double now) {
  if (released_ || state_.phase != Phase::kFinished) return;
  const uint64_t steps = state_.finalized_steps();
  std::vector<std::string> behind;
  for (const MemberRecord* m : active_members(true)) {
    if (m->applied_steps < steps) behind.push_back(short_hex(m->key));
  }
  bool checkpointed = options_.network.checkpointers == 0;
  for (const CheckpointRecord& c : state_.checkpoints) checkpointed |= c.applied_steps == steps;
  const bool timed_out = now >= finished_at_ + options_.network.finish_grace_seconds;
  if (!(behind.empty() && checkpointed) && !timed_out) return;
  released_ = true;
  std::string missing;
  if (!behind.empty()) missing += fmt::format("; still behind: {}", fmt::join(behind, ", "));
  if (!checkpointed) missing += fmt::format("; NO checkpoint of the final state was reported");
  log(EventKind::kPhase,
      fmt::format("members released {:.1f} s after the run finished{}", now - finished_at_,
                  timed_out ? fmt::format(" (network.finish_grace_seconds = {} passed){}",
                                          options_.network.finish_grace_seconds, missing)
                            : std::string()),
      nullptr,
      {{"reason", timed_out ? "grace_passed" : "complete"},
       {"behind", behind.size()},
       {"checkpointed", checkpointed}});
  for (const MemberRecord* m : active_members(true)) send(m->key, finished_for(*m));
}

void StateMachine::keep_checkpointers() {
  if (checkpointers_kept_) return;  // no member changed since the last look
  checkpointers_kept_ = true;
  const int64_t wanted = options_.network.checkpointers;
  int64_t held = 0;
  for (auto& [key, m] : state_.members) {
    if (!current(m)) m.checkpointer = false;  // gone: the role is free for someone else
    held += m.checkpointer ? 1 : 0;
  }
  while (held < wanted) {
    // The longest-serving active member without the role: the most likely to stay.
    MemberRecord* next = nullptr;
    for (auto& [key, m] : state_.members) {
      if (m.state != MemberState::kActive || m.checkpointer) continue;
      if (!next || m.joined_at < next->joined_at) next = &m;
    }
    if (!next) return;
    next->checkpointer = true;
    ++held;
    log(EventKind::kCheckpoint,
        fmt::format("{} now holds the checkpointer role ({} of network.checkpointers = {})",
                    short_hex(next->key), held, wanted),
        &next->key, {{"reason", "handoff"}});
    if (state_.phase == Phase::kFinished) send(next->key, finished_for(*next));
  }
}

// ---- members -----------------------------------------------------------------------------------

void StateMachine::strike(MemberRecord& member, const std::string& why) {
  ++member.strikes;
  ++state_.counters.strikes;
  log(EventKind::kStrike,
      fmt::format("{} strike {} of {}: {}", short_hex(member.key), member.strikes,
                  options_.network.max_strikes, why),
      &member.key,
      {{"strikes", member.strikes}, {"max_strikes", options_.network.max_strikes}});
  if (member.strikes >= options_.network.max_strikes) {
    drop(member, DropReason::kStrikes,
         fmt::format("{} strikes in a row (network.max_strikes = {})", member.strikes,
                     options_.network.max_strikes));
  }
}

void StateMachine::drop(MemberRecord& member, DropReason reason, const std::string& why) {
  member.state = MemberState::kDropped;
  members_changed();
  member.drop_reason = reason;
  ++state_.counters.drops;
  log(EventKind::kDrop,
      fmt::format("{} dropped: {}; {} active", short_hex(member.key), why, active_count()),
      &member.key, {{"reason", to_string(reason)}});
  // Tell it, in case it is still listening; its next message would be refused anyway.
  wire::Envelope message;
  message.mutable_refused()->set_reason(
      fmt::format("dropped from run {}: {}", options_.run_id, why));
  message.mutable_refused()->set_may_rejoin(reason == DropReason::kHeartbeatTimeout);
  send(member.key, std::move(message));
}

void StateMachine::prune_members() {
  std::set<PublicKey> named;
  if (state_.round) {
    for (const auto& [key, ranges] : state_.round->assignments) named.insert(key);
  }
  for (const auto& [t, step] : state_.collecting) {
    named.insert(step.expected.begin(), step.expected.end());
    for (const CommitRecord& c : step.commits) named.insert(c.author);
  }
  std::vector<const MemberRecord*> gone;
  for (const auto& [key, m] : state_.members) {
    if (!current(m) && !named.contains(key)) gone.push_back(&m);
  }
  const size_t keep = static_cast<size_t>(options_.network.max_members);
  if (gone.size() <= keep) return;
  // Members dropped for what they did are forgotten last: forgetting one lets its key rejoin.
  std::sort(gone.begin(), gone.end(), [](const MemberRecord* a, const MemberRecord* b) {
    const bool sa = barred(a->drop_reason), sb = barred(b->drop_reason);
    if (sa != sb) return !sa;
    if (a->last_seen != b->last_seen) return a->last_seen < b->last_seen;
    return a->key < b->key;
  });
  std::vector<PublicKey> forget;
  for (size_t i = 0; i + keep < gone.size(); ++i) forget.push_back(gone[i]->key);
  for (const PublicKey& key : forget) state_.members.erase(key);
}

void StateMachine::mark_caught_up(MemberRecord& member) {
  if (member.state != MemberState::kSyncing) return;
  if (member.applied_steps + static_cast<uint64_t>(options_.network.overlap) >=
      state_.finalized_steps()) {
    member.state = MemberState::kActive;
    members_changed();
    log(EventKind::kCaughtUp,
        fmt::format("{} caught up ({} steps applied); {} active", short_hex(member.key),
                    member.applied_steps, active_count()),
        &member.key);
  }
}

std::shared_ptr<const wire::Envelope> StateMachine::round_start_common() {
  const OpenRound& round = *state_.round;
  if (round_start_common_ && round_start_common_->round_start().step() == round.step) {
    return round_start_common_;
  }
  auto message = std::make_shared<wire::Envelope>();
  wire::RoundStart* start = message->mutable_round_start();
  start->set_step(round.step);
  start->set_apply_through(round.apply_through);
  start->set_report_state(round.report_state);
  std::vector<PublicKey> members;
  for (const auto& [k, ranges] : round.assignments) members.push_back(k);
  add_members(start->mutable_members(), members);
  // Joiners fetch the state from members' servers, which answer only whom the coordinator lists.
  std::vector<PublicKey> joining;
  for (const MemberRecord* m : active_members(/*syncing_too=*/true)) {
    if (m->state == MemberState::kSyncing) joining.push_back(m->key);
  }
  add_members(start->mutable_joining(), joining);
  round_start_common_ = message;
  return message;
}

wire::Envelope StateMachine::round_start_own(const PublicKey& key, double now) const {
  const OpenRound& round = *state_.round;
  wire::Envelope message;
  wire::RoundStart* start = message.mutable_round_start();
  for (const SequenceRange& r : round.assignments.at(key)) {
    wire::SequenceRange* out = start->add_assignment();
    out->set_first(r.first);
    out->set_count(r.count);
  }
  start->set_deadline_seconds(std::max(0.0, round.deadline - now));
  start->set_checkpointer(state_.members.at(key).checkpointer);
  return message;
}

void StateMachine::send_round_start(const PublicKey& key, double now,
                                    const std::shared_ptr<const wire::Envelope>& common) {
  out_->send.push_back(Outgoing{key, round_start_own(key, now), common});
}

wire::Envelope StateMachine::collect_for(const CollectingStep& step) const {
  wire::Envelope message;
  wire::Collect* collect = message.mutable_collect();
  collect->set_step(step.step);
  for (const CommitRecord& c : step.commits) to_wire(c, collect->add_commits());
  add_members(collect->mutable_members(),
              std::vector<PublicKey>(step.expected.begin(), step.expected.end()));
  return message;
}

}  // namespace agora::coord
