#include "agora/coord/spot_checks.h"

#include <algorithm>
#include <cmath>

#include "agora/coord/assignment.h"
#include "agora/core/hash.h"
#include "agora/core/little_endian.h"

namespace agora::coord {

namespace {

std::string step_bytes(uint64_t step) {
  std::string out;
  append_le(out, step, 8);
  return out;
}

uint64_t first_u64(const std::string& bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  }
  return v;
}

const char* outcome_name(wire::Verdict::Outcome outcome) {
  switch (outcome) {
    case wire::Verdict::AGREES:
      return "agrees";
    case wire::Verdict::DISAGREES:
      return "disagrees";
    case wire::Verdict::ABSTAINS:
      return "abstains";
    default:
      return "unknown";
  }
}

}  // namespace

SpotChecks::SpotChecks(VerifyConfig config, std::function<std::string()> random_seed)
    : config_(config), random_seed_(std::move(random_seed)) {}

bool SpotChecks::drawn(const std::string& seed, uint64_t step, const PublicKey& author,
                       double rate) {
  if (rate <= 0) return false;
  if (rate >= 1) return true;
  const uint64_t x = first_u64(blake2b256_bytes(seed + step_bytes(step) + author));
  return static_cast<double>(x) < rate * 18446744073709551616.0;  // 2^64
}

double SpotChecks::share_rate(double rate, uint64_t share, uint64_t sequences, size_t members) {
  if (sequences == 0 || members == 0) return rate;
  const double mean = static_cast<double>(sequences) / static_cast<double>(members);
  return std::min(1.0, rate * std::max(1.0, static_cast<double>(share) / mean));
}

void SpotChecks::remember(uint64_t step, const PublicKey& author, StrategyCommitment commitment) {
  if (step != commitments_step_) {
    commitments_.clear();
    commitments_step_ = step;
  }
  commitments_[author] = std::move(commitment);
}

const StrategyCommitment* SpotChecks::commitment(uint64_t step, const PublicKey& author) const {
  if (step != commitments_step_) return nullptr;
  const auto it = commitments_.find(author);
  return it == commitments_.end() ? nullptr : &it->second;
}

uint64_t SpotChecks::sequences_newly_asked_of(const PublicKey& verifier) const {
  uint64_t total = 0;
  for (const auto& [key, check] : open_) {
    if (check.asked != verifier || check.asked_in != rounds_opened_) continue;
    for (const auto& r : check.request.ranges()) total += r.count();
  }
  return total;
}

int64_t SpotChecks::failures(const PublicKey& key) const {
  const auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

SpotChecks::Output SpotChecks::close(uint64_t step,
                                     const std::map<PublicKey, Contribution>& committed,
                                     const std::set<PublicKey>& others,
                                     const std::function<bool(const PublicKey&)>& current,
                                     double now) {
  Output out;
  std::set<PublicKey> members = others;
  for (const auto& [key, unused] : committed) members.insert(key);
  if (!enabled() || committed.empty() || members.size() < 2) return out;  // nobody to ask
  const std::string seed = random_seed_();
  uint64_t sequences = 0;
  for (const auto& [author, contribution] : committed)
    sequences += total_count(contribution.ranges);
  std::vector<PublicKey> chosen;
  for (const auto& [author, contribution] : committed) {
    const double rate =
        share_rate(config_.rate, total_count(contribution.ranges), sequences, members.size());
    if (current(author) && drawn(seed, step, author, rate) && commitment(step, author) != nullptr) {
      chosen.push_back(author);
    }
  }
  out.events.push_back({.kind = "drawn", .step = step, .seed = seed, .checks = chosen.size()});
  for (const PublicKey& author : chosen) {
    const StrategyCommitment& c = *commitment(step, author);
    const Contribution& contribution = committed.at(author);
    Check check;
    check.claimed_seconds = c.compute_seconds;
    wire::SpotCheck& r = check.request;
    r.set_step(step);
    *r.mutable_author() = contribution.author;
    r.set_payload_hash(c.payload_hash);
    r.set_strategy_before(c.before);
    r.set_strategy_after(c.after);
    r.set_apply_through(c.trained_from);
    // Which tensors its verifiers compare: from the seed, so the author could not know them
    // when it committed, and every verifier of the check (a second opinion too) takes the same.
    r.set_sample(blake2b256_bytes(seed + step_bytes(step) + author + "state sample"));
    for (const SequenceRange& range : contribution.ranges) {
      auto* w = r.add_ranges();
      w->set_first(range.first);
      w->set_count(range.count);
    }
    // Candidates: fewest open checks first (spreads the work), then a seeded order nobody
    // chose; both known to anyone replaying the log.
    std::vector<std::pair<std::pair<size_t, std::string>, PublicKey>> ranked;
    for (const PublicKey& verifier : members) {
      if (verifier == author) continue;
      ranked.push_back(
          {{load_[verifier], blake2b256_bytes(seed + step_bytes(step) + author + verifier)},
           verifier});
    }
    std::sort(ranked.begin(), ranked.end());
    for (auto& [order, verifier] : ranked) check.candidates.push_back(verifier);
    Check& stored = open_[{step, author}] = std::move(check);
    if (!ask_next(stored, current, now, out)) open_.erase({step, author});
  }
  commitments_.clear();
  return out;
}

bool SpotChecks::ask_next(Check& check, const std::function<bool(const PublicKey&)>& current,
                          double now, Output& out) {
  const uint64_t step = check.request.step();
  const PublicKey& author = check.request.author().key();
  if (check.asked) {
    if (load_[*check.asked] > 0) --load_[*check.asked];
    check.asked.reset();
  }
  while (check.next < check.candidates.size()) {
    const PublicKey& v = check.candidates[check.next++];
    if (!current(v)) continue;
    check.asked = v;
    check.asked_at = now;
    check.asked_in = rounds_opened_;
    ++load_[v];
    wire::Envelope message;
    *message.mutable_spot_check() = check.request;
    const auto attempt = static_cast<uint32_t>(check.verdicts.size() + 1);
    message.mutable_spot_check()->set_attempt(attempt);
    out.send.push_back({v, std::move(message)});
    out.events.push_back(
        {.kind = "assigned", .step = step, .author = author, .verifier = v, .attempt = attempt});
    return true;
  }
  out.events.push_back({.kind = "unresolved",
                        .step = step,
                        .author = author,
                        .reason = "no member that trained this round is left to verify it"});
  return false;
}

SpotChecks::Output SpotChecks::on_verdict(const PublicKey& from, const wire::Verdict& verdict,
                                          const std::function<bool(const PublicKey&)>& current,
                                          double now) {
  Output out;
  const auto it = open_.find({verdict.step(), verdict.author()});
  if (it == open_.end() || it->second.asked != from) {
    out.events.push_back({.kind = "ignored",
                          .step = verdict.step(),
                          .author = verdict.author(),
                          .verifier = from,
                          .reason = "no open check of that contribution is assigned to it"});
    return out;
  }
  Check& check = it->second;
  const auto outcome = verdict.outcome();
  out.events.push_back({.kind = "verdict",
                        .step = verdict.step(),
                        .author = verdict.author(),
                        .verifier = from,
                        .attempt = static_cast<uint32_t>(check.verdicts.size() + 1),
                        .outcome = outcome_name(outcome),
                        .reason = verdict.reason().substr(0, 512)});
  bool open = true;
  if (outcome == wire::Verdict::AGREES || outcome == wire::Verdict::DISAGREES) {
    check.verdicts.push_back({from, outcome});
    if (outcome == wire::Verdict::AGREES && std::isfinite(verdict.recompute_seconds())) {
      check.recompute_seconds = std::max(check.recompute_seconds, verdict.recompute_seconds());
    }
    if (load_[from] > 0) --load_[from];
    check.asked.reset();
    open = decide(check, current, now, out);
  } else {
    open = ask_next(check, current, now, out);  // abstained (or said nothing we know)
  }
  if (!open) open_.erase(it);
  return out;
}

bool SpotChecks::decide(Check& check, const std::function<bool(const PublicKey&)>& current,
                        double now, Output& out) {
  const uint64_t step = check.request.step();
  const PublicKey& author = check.request.author().key();
  size_t agree = 0, disagree = 0;
  for (const auto& [v, o] : check.verdicts) (o == wire::Verdict::AGREES ? agree : disagree)++;
  const bool passed = agree >= 2 || (agree == 1 && disagree == 0);
  if (!passed && disagree < 2) return ask_next(check, current, now, out);
  // Decided: whoever said otherwise was wrong.
  const auto losing = passed ? wire::Verdict::DISAGREES : wire::Verdict::AGREES;
  if (passed) {
    out.events.push_back({.kind = "passed",
                          .step = step,
                          .author = author,
                          .claimed_seconds = check.claimed_seconds,
                          .recompute_seconds = check.recompute_seconds});
  } else {
    fail(author, {.kind = "author_failed", .step = step, .author = author}, out);
  }
  for (const auto& [v, o] : check.verdicts) {
    if (o == losing) {
      fail(v, {.kind = "verifier_failed", .step = step, .author = author, .verifier = v}, out);
    }
  }
  return false;
}

void SpotChecks::fail(const PublicKey& key, Event event, Output& out) {
  const int64_t n = ++failures_[key];
  event.failures = n;
  out.events.push_back(std::move(event));
  if (n >= config_.max_failures) out.drop.push_back(key);
}

SpotChecks::Output SpotChecks::restarted(const PublicKey& key,
                                         const std::function<bool(const PublicKey&)>& current,
                                         double now) {
  Output out;
  for (auto it = open_.begin(); it != open_.end();) {
    Check& check = it->second;
    bool open = true;
    if (check.request.author().key() == key) {
      if (check.asked && load_[*check.asked] > 0) --load_[*check.asked];
      out.events.push_back({.kind = "unresolved",
                            .step = check.request.step(),
                            .author = key,
                            .reason = "the author restarted: the states it committed to are gone"});
      open = false;
    } else if (check.asked == key) {
      open = ask_next(check, current, now, out);
    }
    it = open ? std::next(it) : open_.erase(it);
  }
  return out;
}

SpotChecks::Output SpotChecks::tick(uint64_t newest_step,
                                    const std::function<bool(const PublicKey&)>& current,
                                    double now) {
  Output out;
  const auto window = static_cast<uint64_t>(config_.window);
  for (auto it = open_.begin(); it != open_.end();) {
    Check& check = it->second;
    const uint64_t step = check.request.step();
    const PublicKey& author = check.request.author().key();
    bool open = true;
    if (step + window <= newest_step || !current(author)) {
      if (check.asked && load_[*check.asked] > 0) --load_[*check.asked];
      out.events.push_back({.kind = "unresolved",
                            .step = step,
                            .author = author,
                            .reason = current(author)
                                          ? "its states fell out of verify.window before a verdict"
                                          : "the author is no longer a member of the run"});
      open = false;
    } else if (check.asked && (!current(*check.asked) || now - check.asked_at > config_.seconds)) {
      open = ask_next(check, current, now, out);
    }
    it = open ? std::next(it) : open_.erase(it);
  }
  return out;
}

}  // namespace agora::coord
