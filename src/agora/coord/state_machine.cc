#include "agora/coord/state_machine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/core/error.h"
#include "agora/core/list_bits.h"

namespace agora::coord {
using namespace detail;

StateMachine::StateMachine(Options options, RunState state)
    : options_(std::move(options)),
      state_(std::move(state)),
      spot_checks_(
          options_.verify,
          options_.random_seed ? options_.random_seed : [] { return net::random_bytes(32); }) {
  const NetworkConfig& n = options_.network;
  if (options_.batch_size == 0) fail("coordinator: train.batch_size is 0; it must be at least 1");
  if (n.min_peers < 1)
    fail("coordinator: network.min_peers is {}; it must be at least 1", n.min_peers);
  if (n.overlap != 0 && n.overlap != 1) {
    fail("coordinator: network.overlap is {}; allowed: 0 or 1", n.overlap);
  }
  if (!(n.quorum >= 0.0 && n.quorum < 1.0)) {
    fail("coordinator: network.quorum is {}; it must be in [0, 1)", n.quorum);
  }
  if (n.max_strikes < 1)
    fail("coordinator: network.max_strikes is {}; it must be at least 1", n.max_strikes);
  if (n.hash_interval < 1) {
    fail("coordinator: network.hash_interval is {}; it must be at least 1", n.hash_interval);
  }
  if (n.max_members < 1)
    fail("coordinator: network.max_members is {}; it must be at least 1", n.max_members);
}

// ---- entry points ------------------------------------------------------------------------------

template <typename Body>
Actions StateMachine::collect_actions(double now, Body&& body) {
  Actions actions;
  out_ = &actions;
  now_ = now;
  try {
    body();
  } catch (...) {
    out_ = nullptr;
    throw;
  }
  out_ = nullptr;
  return actions;
}

Actions StateMachine::handle(const net::PublicKey& from, const wire::Envelope& message,
                             double now) {
  return collect_actions(now, [&] {
    if (state_.phase == Phase::kFinished) {
      auto it = state_.members.find(from);
      if (it != state_.members.end() && current(it->second)) {
        handle_finished(it->second, message, now);
      } else {
        wire::Envelope reply;
        reply.mutable_finished()->set_steps(state_.finalized_steps());
        send(from, std::move(reply));
      }
      return;
    }
    if (message.has_join()) {
      on_join(from, message.join(), now);
    } else {
      auto it = state_.members.find(from);
      if (it == state_.members.end() || it->second.state == MemberState::kLeft) {
        refuse(from,
               fmt::format("join first: {} is not a member of run {}", short_hex(from),
                           options_.run_id),
               /*may_rejoin=*/true);
      } else if (it->second.state == MemberState::kDropped) {
        refuse(from,
               fmt::format("{} was dropped from run {}: {}; join again", short_hex(from),
                           options_.run_id, drop_text(it->second.drop_reason)),
               it->second.drop_reason == DropReason::kHeartbeatTimeout);
      } else {
        MemberRecord& member = it->second;
        member.last_seen = now;
        switch (message.body_case()) {
          case wire::Envelope::kHeartbeat: {
            const MemberState before = member.state;
            on_heartbeat(member, message.heartbeat(), now);
            // Most messages are heartbeats (one per member per second) and most change nothing
            // progress() looks at: what only time changes, the tick's progress() sees. At 1000
            // members, a progress() per heartbeat (scans of every member) was the state
            // machine's largest cost (docs/scaling.md).
            if (member.state == before) return;
            break;
          }
          case wire::Envelope::kLeave:
            on_leave(member);
            break;
          case wire::Envelope::kCommit:
            on_commit(member, message.commit(), now);
            break;
          case wire::Envelope::kWitness:
            on_witness(member, message.witness());
            break;
          case wire::Envelope::kStateReport:
            on_state_report(member, message.state_report());
            break;
          case wire::Envelope::kGetFinalized:
            on_get_finalized(member, message.get_finalized());
            break;
          case wire::Envelope::kCheckpointReport:
            on_checkpoint_report(member, message.checkpoint_report(), now);
            break;
          case wire::Envelope::kVerdict:
            on_verdict(member, message.verdict(), now);
            break;
          default:
            log(EventKind::kIgnored,
                fmt::format("ignored a message of kind {} from {}: not one a peer sends the "
                            "coordinator",
                            static_cast<int>(message.body_case()), short_hex(from)));
        }
      }
    }
    progress(now);
  });
}

Actions StateMachine::tick(double now) {
  return collect_actions(now, [&] {
    if (released_) return;
    const double timeout = options_.network.heartbeat_timeout_seconds;
    for (auto& [key, member] : state_.members) {
      if (current(member) && now - member.last_seen > timeout) {
        drop(member, DropReason::kHeartbeatTimeout,
             fmt::format("silent for {:.1f} s (network.heartbeat_timeout_seconds = {})",
                         now - member.last_seen, timeout));
      }
    }
    if (state_.phase == Phase::kFinished) {
      keep_checkpointers();
      maybe_release(now);
      return;
    }
    if (state_.round && now >= state_.round->deadline) close_round(now);
    act_on(spot_checks_.tick(
        state_.next_step, [&](const PublicKey& k) { return is_current(k); }, now));
    progress(now);
    prune_members();
  });
}

Actions StateMachine::resume(double now) {
  return collect_actions(now, [&] {
    for (auto& [key, member] : state_.members) {
      if (current(member)) member.last_seen = now;
    }
    if (state_.phase == Phase::kFinished) {
      // The members may still be lingering for the release this coordinator never sent.
      finished_at_ = now;
      for (const MemberRecord* m : active_members(true)) send(m->key, finished_for(*m));
      maybe_release(now);
      return;
    }
    log(EventKind::kPhase,
        fmt::format("resumed run {} in phase {}: {} steps final, next round {}", options_.run_id,
                    to_string(state_.phase), state_.finalized_steps(), state_.next_step));
    if (state_.round) {
      OpenRound& round = *state_.round;
      round.deadline = std::max(round.deadline, now + options_.network.min_deadline_seconds);
      const auto common = round_start_common();
      for (const auto& [key, ranges] : round.assignments) {
        if (is_current(key) && !round.commits.contains(key)) send_round_start(key, now, common);
      }
    }
    for (auto& [step, collecting] : state_.collecting) {
      if (collecting.commits.empty()) continue;
      collecting.deadline = std::max(collecting.deadline, now + options_.network.witness_seconds);
      const auto collect = std::make_shared<const wire::Envelope>(collect_for(collecting));
      for (const PublicKey& key : collecting.expected) {
        if (is_current(key) && !collecting.witnessed.contains(key)) {
          send(key, collect);
        }
      }
    }
    progress(now);
  });
}

// ---- messages ----------------------------------------------------------------------------------

void StateMachine::on_heartbeat(MemberRecord& member, const wire::Heartbeat& heartbeat,
                                double now) {
  record_applied(member, heartbeat.applied_steps());
  // Heals a RoundStart lost while the connection was down: the peer says which round it waits
  // for, and the open round is that one or newer.
  const auto& round = state_.round;
  if (round && round->step >= heartbeat.next_round() && round->assignments.contains(member.key) &&
      !round->commits.contains(member.key) && now - round->opened_at >= kRoundStartHealSeconds) {
    // Each copy waits twice as long as the one before (5, 10, 20 s...): a member whose copy is
    // queued behind a busy coordinator's sends, not lost, would otherwise be sent one more every
    // 5 s, and at 2000 members those copies made the rounds longer still (docs/scaling.md).
    auto& [healed, wait] = round_start_healed_[member.key];
    if (healed > round->opened_at && now - healed < wait) return;
    wait = 2 * (healed > round->opened_at ? wait : kRoundStartHealSeconds);  // the next one's
    healed = now;
    send_round_start(member.key, now, round_start_common());
  }
}

void StateMachine::record_applied(MemberRecord& member, uint64_t applied_steps) {
  // Self-reported (Known limits); never past the ledger, which no honest peer can be.
  member.applied_steps = std::min(applied_steps, state_.finalized_steps());
  mark_caught_up(member);
}

void StateMachine::on_leave(MemberRecord& member) {
  member.state = MemberState::kLeft;
  members_changed();
  ++state_.counters.leaves;
  log(EventKind::kLeave, fmt::format("{} left; {} active", short_hex(member.key), active_count()),
      &member.key);
}

void StateMachine::on_commit(MemberRecord& member, const wire::Commit& commit, double now) {
  const wire::CommitRecord& record = commit.record();
  const std::string who = short_hex(member.key);
  auto reject = [&](const std::string& why) {
    ++state_.counters.commits_rejected;
    log(EventKind::kRejection,
        fmt::format("dropped a commit from {} for step {}: {}", who, record.step(), why),
        &member.key);
  };
  if (!commit.has_record()) return reject("it has no record");
  if (record.author() != member.key) {
    return reject(fmt::format("the record's author is {} but the connection authenticated {}",
                              short_hex(record.author()), who));
  }
  const uint64_t open_step = state_.round ? state_.round->step : state_.next_step;
  if (record.step() < open_step) {
    ++state_.counters.commits_late;
    const std::optional<double> measured = learn_from_late_commit(member, commit, now);
    std::vector<obs::LogField> fields{{"round", record.step()}};
    if (measured) fields.push_back({"sequences_per_second", *measured});
    log(EventKind::kIgnored,
        fmt::format("ignored a late commit from {} for step {}: its round already closed{}", who,
                    record.step(),
                    measured ? fmt::format(" (it measures {:.3g} sequences/s)", *measured) : ""),
        &member.key, std::move(fields));
    return;
  }
  if (!state_.round || record.step() != state_.round->step) {
    return reject(state_.round ? fmt::format("the open round is step {}", state_.round->step)
                               : std::string("no round is open"));
  }
  OpenRound& round = *state_.round;
  if (!round.assignments.contains(member.key)) {
    return reject(fmt::format("{} is not assigned in round {}", who, round.step));
  }
  if (record.payload_hash().size() != kHashBytes) {
    return reject(fmt::format("the payload hash has {} bytes; expected {}",
                              record.payload_hash().size(), kHashBytes));
  }
  if (!net::verify_signature(
          member.key,
          net::commit_signing_bytes(options_.run_id, record.step(), record.payload_hash()),
          record.signature())) {
    return reject("the signature does not verify against the author's key");
  }
  if (const auto why = check_strategy_commitment(member, commit)) return reject(*why);
  auto existing = round.commits.find(member.key);
  if (existing != round.commits.end()) {
    if (existing->second.payload_hash != record.payload_hash()) {
      reject(fmt::format("it already committed payload {} for this step; the first stands",
                         short_hex(existing->second.payload_hash)));
    }
    return;  // a repeat of the same commit changes nothing
  }
  round.commits[member.key] =
      CommitRecord{member.key, record.step(), record.payload_hash(), record.signature()};
  if (spot_checks_.enabled()) {
    spot_checks_.remember(record.step(), member.key,
                          {record.payload_hash(), commit.trained_from(), commit.compute_seconds(),
                           commit.strategy_before(), commit.strategy_after()});
  }
  ++state_.counters.commits_accepted;
  update_throughput(member, round, commit, now);
}

void StateMachine::on_witness(MemberRecord& member, const wire::Witness& witness) {
  const std::string who = short_hex(member.key);
  auto it = state_.collecting.find(witness.step());
  if (it == state_.collecting.end()) {
    log(EventKind::kIgnored,
        fmt::format("ignored a witness from {} for step {}: that step is not collecting", who,
                    witness.step()),
        &member.key);
    return;
  }
  CollectingStep& step = it->second;
  if (!step.expected.contains(member.key)) {
    log(EventKind::kIgnored,
        fmt::format("ignored a witness from {} for step {}: it was not active when the step "
                    "closed",
                    who, witness.step()),
        &member.key);
    return;
  }
  if (step.witnessed.contains(member.key)) {
    // One Witness per member per step: an honest peer sends one (resume re-sends Collect only
    // to those that have not answered). A repeat changes nothing and records nothing.
    ++state_.counters.witnesses_repeated;
    return;
  }
  std::string held;
  if (witness.has_of_collect()) {
    if (!list_bits_valid(witness.of_collect(), step.commits.size()) || witness.held_size() > 0) {
      log(EventKind::kIgnored,
          fmt::format("ignored a witness from {} for step {}: its of_collect must be {} bytes "
                      "(one bit per commit of the Collect, padding bits 0) and come without "
                      "`held`; it was {} bytes with {} hashes",
                      who, witness.step(), (step.commits.size() + 7) / 8,
                      witness.of_collect().size(), witness.held_size()),
          &member.key, {{"reason", "malformed_witness"}});
      return;
    }
    held = witness.of_collect();
  } else {
    held = list_bits(step.commits.size());
    if (witness.held_size() > 0) {
      // Two authors may commit the same bytes: a hash holds every commit that names it.
      std::unordered_multimap<std::string_view, size_t> index;
      for (size_t i = 0; i < step.commits.size(); ++i) index.emplace(step.commits[i].payload_hash, i);
      for (const std::string& hash : witness.held()) {
        const auto [first, last] = index.equal_range(hash);
        for (auto it = first; it != last; ++it) set_list_bit(held, it->second);
      }
    }
  }
  // A rejection counts once per committed author other than the witness itself; at most
  // kMaxRejectionEvents of them become events (the rest are counted).
  std::set<PublicKey> authors;
  if (witness.rejected_size() > 0) {
    for (const CommitRecord& c : step.commits) authors.insert(c.author);
  }
  std::set<PublicKey> rejected;
  size_t suppressed = 0;
  for (const wire::Rejection& rejection : witness.rejected()) {
    if (!authors.contains(rejection.author()) || rejection.author() == member.key ||
        !rejected.insert(rejection.author()).second) {
      continue;
    }
    ++state_.counters.rejections_reported;
    if (rejected.size() > kMaxRejectionEvents) {
      ++suppressed;
      continue;
    }
    log(EventKind::kRejection,
        fmt::format("{} rejected {}'s payload for step {}: {}", who, short_hex(rejection.author()),
                    step.step, printable(rejection.reason())),
        &member.key, {{"author", short_hex(rejection.author())}, {"for_step", step.step}});
  }
  if (suppressed > 0) {
    log(EventKind::kRejection,
        fmt::format("{} rejected {} more payloads for step {}", who, suppressed, step.step),
        &member.key, {{"for_step", step.step}, {"more", suppressed}});
  }
  step.witnessed[member.key] = std::move(held);
  ++state_.counters.witnesses;
}

void StateMachine::on_get_finalized(MemberRecord& member, const wire::GetFinalized& request) {
  wire::Envelope reply;
  if (request.step() < state_.finalized_steps()) {
    wire::Finalized* f = reply.mutable_finalized();
    f->set_step(request.step());
    for (const CommitRecord& c : state_.finalized[request.step()]) to_wire(c, f->add_set());
  } else {
    reply.mutable_not_found()->set_what(fmt::format("step {} is not final yet ({} steps are)",
                                                    request.step(), state_.finalized_steps()));
  }
  send(member.key, std::move(reply));
}

// ---- helpers -----------------------------------------------------------------------------------

bool StateMachine::is_current(const PublicKey& key) const {
  const auto it = state_.members.find(key);
  return it != state_.members.end() && current(it->second);
}

std::vector<const MemberRecord*> StateMachine::active_members(bool syncing_too) const {
  std::vector<const MemberRecord*> out;
  for (const auto& [key, m] : state_.members) {
    if (m.state == MemberState::kActive || (syncing_too && m.state == MemberState::kSyncing)) {
      out.push_back(&m);
    }
  }
  return out;
}

size_t StateMachine::active_count() const {
  if (!active_count_) {
    active_count_ = static_cast<size_t>(
        std::count_if(state_.members.begin(), state_.members.end(),
                      [](const auto& item) { return item.second.state == MemberState::kActive; }));
  }
  return *active_count_;
}

void StateMachine::add_members(google::protobuf::RepeatedPtrField<wire::Member>* out,
                               const std::vector<PublicKey>& keys) const {
  for (const PublicKey& key : keys) {
    wire::Member* m = out->Add();
    m->set_key(key);
    auto it = state_.members.find(key);
    if (it != state_.members.end()) m->set_endpoint(it->second.endpoint);
    m->set_relayed(relayed_.contains(key));
  }
}

Actions StateMachine::set_relayed(const PublicKey& key, bool relayed, const std::string& why,
                                  double now) {
  return collect_actions(now, [&] {
    if (std::erase_if(relayed_, [&](const PublicKey& k) { return !is_current(k); }) > 0) {
      members_changed();
    }
    std::erase_if(strike_free_below_, [&](const auto& item) { return !is_current(item.first); });
    strike_free_below_.erase(key);
    if (!is_current(key)) return;
    if (relayed) {
      // It hears that it is relayed from the next RoundStart on; what it committed before
      // reached nobody, through no fault of its own.
      strike_free_below_[key] = state_.round ? state_.round->step + 1 : state_.next_step;
    }
    if (relayed_.contains(key) == relayed) return;
    members_changed();
    if (relayed) {
      relayed_.insert(key);
    } else {
      relayed_.erase(key);
    }
    log(EventKind::kJoin,
        relayed ? fmt::format("{} cannot be dialled ({}): its payloads go through the "
                              "coordinator's relay",
                              short_hex(key), printable(why))
                : fmt::format("{} answers at its endpoint again ({}): no relay", short_hex(key),
                              printable(why)),
        &key, {{"reason", relayed ? "unreachable" : "reachable"}});
  });
}

wire::Envelope Outgoing::merged() const {
  if (!shared) return message;
  wire::Envelope whole = *shared;
  whole.MergeFrom(message);
  return whole;
}

void StateMachine::send(const PublicKey& to, wire::Envelope message) {
  out_->send.push_back(Outgoing{to, std::move(message)});
}

void StateMachine::send(const PublicKey& to, std::shared_ptr<const wire::Envelope> shared) {
  out_->send.push_back(Outgoing{to, {}, std::move(shared)});
}

void StateMachine::refuse(const PublicKey& to, const std::string& reason, bool may_rejoin,
                          const std::string& code) {
  ++state_.counters.refusals;
  wire::Envelope message;
  message.mutable_refused()->set_reason(reason);
  message.mutable_refused()->set_may_rejoin(may_rejoin);
  send(to, std::move(message));
  std::vector<obs::LogField> fields;
  if (!code.empty()) fields.push_back({"reason", code});
  log(EventKind::kRejection, fmt::format("refused {}: {}", short_hex(to), reason), &to,
      std::move(fields));
}

void StateMachine::log(EventKind kind, const std::string& line, const PublicKey* about,
                       std::vector<obs::LogField> fields) {
  // What a member makes the coordinator ignore or reject is its own doing, so it is bounded per
  // member and round: a repeated bad message cannot fill the event history or the database.
  if (about != nullptr && (kind == EventKind::kIgnored || kind == EventKind::kRejection)) {
    if (events_round_ != state_.next_step) {
      member_events_.clear();
      events_round_ = state_.next_step;
    }
    const size_t n = ++member_events_[*about];
    if (n > kMaxMemberEventsPerRound) {
      ++state_.counters.events_suppressed;
      if (n == kMaxMemberEventsPerRound + 1) {
        record(EventKind::kIgnored,
               fmt::format("{} caused {} ignored or rejected messages in round {}; further ones "
                           "are counted, not recorded, until the next round",
                           short_hex(*about), kMaxMemberEventsPerRound, state_.next_step),
               about, {{"reason", "events_capped"}});
      }
      return;
    }
  }
  record(kind, line, about, std::move(fields));
}

void StateMachine::record(EventKind kind, const std::string& line, const PublicKey* about,
                          std::vector<obs::LogField> fields) {
  if (out_ != nullptr) {
    out_->log.push_back({line, about ? short_hex(*about) : std::string(), kind, std::move(fields)});
  }
  state_.events.push_back(Event{++state_.counters.events, now_, line, kind});
  while (state_.events.size() > kMaxEvents) state_.events.pop_front();
}

}  // namespace agora::coord
