// The state machine's spot checks (spot_checks.h decides; this file feeds it and acts): the
// strategy commitment every commit carries when verify.rate > 0, the draw when a round closes,
// verdicts, and dropping a member whose failures reached verify.max_failures.
// (Entry points are in state_machine.cc.)
#include <fmt/format.h>

#include "agora/coord/state_machine.h"
#include "agora/coord/state_machine_detail.h"
#include "agora/core/hex.h"

namespace agora::coord {
using namespace detail;

std::optional<std::string> StateMachine::check_strategy_commitment(
    const MemberRecord& member, const wire::Commit& commit) const {
  if (!spot_checks_.enabled()) return std::nullopt;
  if (commit.strategy_before().size() != kHashBytes ||
      commit.strategy_after().size() != kHashBytes) {
    return fmt::format(
        "it carries no strategy commitment (strategy_before and strategy_after of {} bytes), "
        "which verify.rate = {} requires",
        kHashBytes, options_.verify.rate);
  }
  const wire::CommitRecord& record = commit.record();
  // The round's apply_through at least (peers apply every step below it first), and nothing
  // that is not final.
  const uint64_t from = commit.trained_from();
  const uint64_t least = state_.round ? state_.round->apply_through : 0;
  if (from < least || from > state_.finalized_steps()) {
    return fmt::format("it says it trained from the parameters after {} steps (allowed: {} to {})",
                       from, least, state_.finalized_steps());
  }
  if (!net::verify_signature(
          member.key,
          net::strategy_signing_bytes(options_.run_id, record.step(), record.payload_hash(), from,
                                      commit.strategy_before(), commit.strategy_after()),
          commit.strategy_signature())) {
    return std::string("the strategy signature does not verify against the author's key");
  }
  return std::nullopt;
}

void StateMachine::draw_spot_checks(const OpenRound& round, const CollectingStep& step,
                                    double now) {
  if (!spot_checks_.enabled()) return;
  std::map<PublicKey, Contribution> committed;
  for (const CommitRecord& c : step.commits) {
    Contribution& contribution = committed[c.author];
    google::protobuf::RepeatedPtrField<wire::Member> one;
    add_members(&one, {c.author});
    contribution.author = one[0];
    contribution.ranges = step.ranges.at(c.author);
  }
  std::set<PublicKey> others;
  for (const PublicKey& key : step.expected) {
    if (!committed.contains(key)) others.insert(key);
  }
  act_on(spot_checks_.close(
      round.step, committed, others, [&](const PublicKey& k) { return is_current(k); }, now));
}

void StateMachine::on_verdict(MemberRecord& member, const wire::Verdict& verdict, double now) {
  act_on(spot_checks_.on_verdict(
      member.key, verdict, [&](const PublicKey& k) { return is_current(k); }, now));
}

void StateMachine::act_on(SpotChecks::Output output) {
  for (auto& [to, message] : output.send) send(to, std::move(message));
  for (const SpotChecks::Event& e : output.events) {
    const std::string author = short_hex(e.author), verifier = short_hex(e.verifier);
    std::vector<obs::LogField> fields = {{"check", e.kind}, {"round", e.step}};
    if (!e.author.empty()) fields.push_back({"author", hex_encode(e.author)});
    if (!e.verifier.empty()) fields.push_back({"verifier", hex_encode(e.verifier)});
    std::string text;
    if (e.kind == "drawn") {
      if (e.checks == 0) continue;  // nothing to audit
      fields.push_back({"seed", hex_encode(e.seed)});
      fields.push_back({"checks", e.checks});
      text = fmt::format("step {}: {} spot check(s) drawn (seed {})", e.step, e.checks,
                         short_hex(e.seed));
    } else if (e.kind == "assigned") {
      fields.push_back({"attempt", static_cast<uint64_t>(e.attempt)});
      text = fmt::format("step {}: {} verifies {}'s contribution (verifier {} of at most 3)",
                         e.step, verifier, author, e.attempt);
    } else if (e.kind == "verdict") {
      fields.push_back({"outcome", e.outcome});
      fields.push_back({"reason", e.reason});
      text = fmt::format("step {}: {} {} with {}'s contribution{}{}", e.step, verifier, e.outcome,
                         author, e.reason.empty() ? "" : ": ", printable(e.reason));
    } else if (e.kind == "passed") {
      fields.push_back({"claimed_seconds", e.claimed_seconds});
      fields.push_back({"recompute_seconds", e.recompute_seconds});
      text = fmt::format(
          "step {}: {}'s contribution verified ({:.2f} s to recompute; it said "
          "{:.2f} s)",
          e.step, author, e.recompute_seconds, e.claimed_seconds);
    } else if (e.kind == "author_failed") {
      fields.push_back({"failures", e.failures});
      text = fmt::format(
          "step {}: {}'s contribution is not the work it was assigned (two verifiers agree); "
          "failure {} of {}",
          e.step, author, e.failures, options_.verify.max_failures);
    } else if (e.kind == "verifier_failed") {
      fields.push_back({"failures", e.failures});
      text = fmt::format(
          "step {}: {}'s verdict on {}'s contribution was overruled by two others; failure {} "
          "of {}",
          e.step, verifier, author, e.failures, options_.verify.max_failures);
    } else if (e.kind == "unresolved") {
      fields.push_back({"reason", e.reason});
      text = fmt::format("step {}: the check of {}'s contribution ends unresolved: {}", e.step,
                         author, e.reason);
    } else {  // ignored: a verdict nobody asked this member for
      log(EventKind::kIgnored,
          fmt::format("ignored a verdict from {} on {}'s step {}: {}", verifier, author, e.step,
                      e.reason),
          &e.verifier);
      continue;
    }
    const PublicKey* about = e.kind == "verifier_failed" || e.kind == "assigned" ? &e.verifier
                             : e.author.empty()                                  ? nullptr
                                                                                 : &e.author;
    log(EventKind::kVerify, text, about, std::move(fields));
  }
  for (const PublicKey& key : output.drop) {
    auto it = state_.members.find(key);
    if (it == state_.members.end() || !current(it->second)) continue;
    drop(it->second, DropReason::kFailedVerification,
         fmt::format("{} confirmed failures in spot checks (verify.max_failures = {})",
                     spot_checks_.failures(key), options_.verify.max_failures));
  }
}

}  // namespace agora::coord
