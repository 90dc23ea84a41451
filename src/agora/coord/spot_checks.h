// SpotChecks: the coordinator's side of verification by recomputation (docs/verification.md).
//
// Each round, once its commits closed, a random share verify.rate of the contributions is
// checked: another member that trained the same round (so it holds the parameters the author
// trained from) redoes the author's step and answers with a Verdict. What decides:
//
//   The draw. A 32-byte seed is drawn after the commits closed, so no author knew at commit time
//   whether its step would be checked, and logged with the step. Author a's contribution to step
//   s is checked when BLAKE2b(seed | s | a), read as a 64-bit number, is below p x 2^64, where
//   p = min(1, rate x max(1, share / mean share)), the mean over the round's active members
//   (those that committed nothing count, with nothing): a share up to the mean size is checked
//   at verify.rate (at rate 1, every one), a larger one in proportion. Shares follow delivered
//   throughput, so a member that skips the work commits fast and takes more data; checked in
//   proportion, it wastes about max_failures / (rate x members) batches' worth of data before
//   it is dropped, whatever share it takes. The price: with unequal shares more than rate x
//   batch sequences are recomputed a round.
//   Its verifiers, in the order they would be asked, are the round's other active members (its
//   committers, and those handed an empty share: a member that takes the whole batch is still
//   checked) ranked by fewest open checks, then by BLAKE2b(seed | s | a | v): a function of the
//   seed and the round, so a replay of the log decides the same. Every member keeps the
//   parameters of its last verify.window applied counts, so each holds those a check needs.
//
//   The states of one check:
//     asked      a verifier was sent the SpotCheck and has verify.seconds to answer. An answer
//                from anyone else, or for another check, changes nothing. ABSTAINS, a timeout,
//                or the verifier leaving asks the next candidate (or ends it unresolved).
//     resolved   one of:
//                  passed        the first verdict agrees, or two agree;
//                  author failed two verdicts disagree;
//                  unresolved    no candidate is left, the author left or restarted, or the
//                                step fell out of verify.window rounds (the states it needs are
//                                gone).
//                A first DISAGREES is evidence, not a judgement: the check goes to a second
//                verifier, and to a third if the two split. Whoever is on the losing side of a
//                decided dispute (a verifier that accused an honest author, or one that covered
//                for a failing one) gets a failure, like the failing author.
//   Failures. verify.max_failures confirmed failures drop a member (failed_verification).
//
// Bounds: commitments are kept for the open round's assigned members only; checks for at most
// verify.window rounds back, each with at most 3 verdicts. Runtime only: a restarted coordinator
// forgets open checks and failure counts (they are in its log).
//
// Pure: no clock, no sockets; the state machine passes `now` and sends what comes back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/data/sequence_range.h"
#include "agora/net/identity.h"
#include "agora/wire/agora.pb.h"

namespace agora::coord {

using net::PublicKey;

// What an author committed to besides its payload (wire::Commit's strategy fields).
struct StrategyCommitment {
  std::string payload_hash;
  uint64_t trained_from = 0;   // the finalized steps in the parameters it trained from
  double compute_seconds = 0;  // what it said its share took (Commit.compute_seconds)
  std::string before;          // 32 bytes each
  std::string after;
};

// One contribution that may be drawn: its author's share and commitment.
struct Contribution {
  wire::Member author;  // key and endpoint, as others dial it
  std::vector<SequenceRange> ranges;
};

class SpotChecks {
 public:
  // What happened, for the state machine to log and act on. `kind` is the "check" field of the
  // coordinator's verify events: drawn, assigned, verdict, passed, author_failed,
  // verifier_failed, unresolved, ignored.
  struct Event {
    std::string kind = {};
    uint64_t step = 0;
    PublicKey author = {}, verifier = {};
    uint32_t attempt = 0;
    std::string outcome = {};  // a verdict's
    std::string reason = {};
    int64_t failures = 0;   // author_failed / verifier_failed: the member's count now
    std::string seed = {};  // drawn: 32 bytes
    // passed: what the author said its share took, and the verifiers' recomputations (their
    // own machines, at low priority beside training: an operator compares, nothing decides).
    double claimed_seconds = 0;
    double recompute_seconds = 0;
    uint64_t checks = 0;  // drawn: how many
  };
  struct Output {
    std::vector<std::pair<PublicKey, wire::Envelope>> send;  // SpotChecks to verifiers
    std::vector<Event> events;
    std::vector<PublicKey> drop;  // reached verify.max_failures
  };

  // `random_seed` gives 32 unpredictable bytes (the service: libsodium; tests: a script).
  SpotChecks(VerifyConfig config, std::function<std::string()> random_seed);

  bool enabled() const { return config_.rate > 0; }

  // An accepted commit of the open round `step` carried this commitment. The newest step wins:
  // commitments of older rounds are forgotten.
  void remember(uint64_t step, const PublicKey& author, StrategyCommitment commitment);
  const StrategyCommitment* commitment(uint64_t step, const PublicKey& author) const;

  // The commit phase of `step` closed with these contributions (by author; every one of them
  // committed): draws and asks the first verifiers. `others` are the active members that did
  // not commit (an empty share, a missed deadline): they may verify too. `current` says whether
  // a key may still be asked.
  Output close(uint64_t step, const std::map<PublicKey, Contribution>& committed,
               const std::set<PublicKey>& others,
               const std::function<bool(const PublicKey&)>& current, double now);

  // A Verdict from `from`.
  Output on_verdict(const PublicKey& from, const wire::Verdict& verdict,
                    const std::function<bool(const PublicKey&)>& current, double now);

  // Timeouts, departed verifiers and authors, and checks older than verify.window rounds behind
  // `newest_step`.
  Output tick(uint64_t newest_step, const std::function<bool(const PublicKey&)>& current,
              double now);

  // `key` joined again: a new process, which holds neither the states it committed to as an
  // author (its checks end unresolved) nor the checks it was asked (they go to the next).
  Output restarted(const PublicKey& key, const std::function<bool(const PublicKey&)>& current,
                   double now);

  // The run went back to a checkpoint: every open check is about a step that will be trained
  // again, and ends without a verdict.
  void forget_open() {
    open_.clear();
    load_.clear();
  }

  size_t open_checks() const { return open_.size(); }
  // The sequences `verifier` was asked to recompute since the last round_opened() and has not
  // answered yet: work it does beside the share of the round opening now (open_round makes that
  // share smaller by as much). A check asked before the last round opened was counted then:
  // counting it again for every round it stays open would starve a slow verifier of data.
  uint64_t sequences_newly_asked_of(const PublicKey& verifier) const;
  void round_opened() { ++rounds_opened_; }
  int64_t failures(const PublicKey& key) const;

  // The draw's rule, exposed for tests: whether author's contribution to step is checked.
  static bool drawn(const std::string& seed, uint64_t step, const PublicKey& author, double rate);
  // The chance that a contribution of `share` of the `sequences` a round's `members` committed
  // is drawn: verify.rate for a share up to the mean size, in proportion above it (at most 1).
  static double share_rate(double rate, uint64_t share, uint64_t sequences, size_t members);

 private:
  struct Check {
    wire::SpotCheck request;  // without attempt
    double claimed_seconds = 0;
    double recompute_seconds = 0;       // the slowest agreeing verifier's
    std::vector<PublicKey> candidates;  // in the order they are asked
    size_t next = 0;                    // the next candidate to ask
    std::optional<PublicKey> asked;
    double asked_at = 0;
    uint64_t asked_in = 0;  // rounds_opened_ when it was asked
    std::vector<std::pair<PublicKey, wire::Verdict::Outcome>> verdicts;
  };
  using Key = std::pair<uint64_t, PublicKey>;  // step, author

  // Asks the next current candidate, or resolves the check unresolved; false when it ended.
  bool ask_next(Check& check, const std::function<bool(const PublicKey&)>& current, double now,
                Output& out);
  // After a verdict: passed, failed, or on to the next verifier.
  bool decide(Check& check, const std::function<bool(const PublicKey&)>& current, double now,
              Output& out);
  void fail(const PublicKey& key, Event event, Output& out);

  VerifyConfig config_;
  std::function<std::string()> random_seed_;
  uint64_t commitments_step_ = 0;
  std::map<PublicKey, StrategyCommitment> commitments_;
  std::map<Key, Check> open_;
  std::map<PublicKey, size_t> load_;  // open checks each member is asked now
  std::map<PublicKey, int64_t> failures_;
  uint64_t rounds_opened_ = 0;  // round_opened() calls: when each ask fell
};

}  // namespace agora::coord
