#include "agora/peer/round.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/list_bits.h"
#include "agora/net/envelope.h"
#include "agora/obs/log.h"
#include "agora/peer/session.h"
#include "agora/peer/state_sync.h"
#include "agora/peer/test_hooks.h"

namespace agora::peer {

using Clock = std::chrono::steady_clock;

bool Round::handle_passive(const wire::Envelope& m) {
  if (m.has_finalized()) {
    const auto& f = m.finalized();
    if (!f.has_of_collect()) {
      finalized_[f.step()] = {f.set().begin(), f.set().end()};
    } else if (auto set = final_of_collect(f)) {
      finalized_[f.step()] = std::move(*set);
    }
    // Bits over a Collect this peer did not get (or do not fit it): catch_up() asks GetFinalized,
    // answered with the whole set.
    return true;
  }
  if (m.has_spot_check()) {
    verification_.submit(m.spot_check());
    return true;
  }
  if (m.has_collect()) {
    const auto& c = m.collect();
    if (c.step() >= peer_.applied) {
      collected_[c.step()] = {c.commits().begin(), c.commits().end()};
      while (collected_.size() > kKeptCollects) collected_.erase(collected_.begin());
    }
    peer_.members.assign(c.members().begin(), c.members().end());
    peer_.link.collect(c.step(), {c.commits().begin(), c.commits().end()}, peer_.members, true);
    return true;
  }
  return false;
}

std::optional<std::vector<wire::CommitRecord>> Round::final_of_collect(
    const wire::Finalized& f) const {
  auto collect = collected_.find(f.step());
  if (collect == collected_.end()) return std::nullopt;
  const std::vector<wire::CommitRecord>& commits = collect->second;
  const std::string& bits = f.of_collect();
  if (!list_bits_valid(bits, commits.size())) return std::nullopt;
  std::vector<wire::CommitRecord> set;
  for (size_t i = 0; i < commits.size(); ++i) {
    if (list_bit(bits, i)) set.push_back(commits[i]);
  }
  return set;
}

std::optional<uint64_t> Round::pending_final() const {
  if (finalized_.empty() || finalized_.rbegin()->first < peer_.applied) return std::nullopt;
  return finalized_.rbegin()->first;
}

namespace {

// A set asked for and not received is asked for again this often.
constexpr auto kAskAgain = std::chrono::seconds(5);
// How long a coordinator that keeps answering (it is up) may leave a set unsent before the peer
// gives up: the bound a payload nobody serves has (PeerLink::ensure in apply()). A coordinator that
// says nothing at all is down or unreachable, and the peer waits for it, as in every phase but
// joining (docs/protocol.md, "coordinator killed").
constexpr auto kSetStall = std::chrono::seconds(120);
// What arrives while catching up waits for the main loop. Heartbeats make the coordinator repeat
// the open RoundStart, and a coordinator may flood: the queue is bounded, the oldest dropped (a
// newer RoundStart supersedes it; a lost Resync or Finished is repeated at a later report or
// heartbeat).
constexpr size_t kMaxDeferred = 1024;

// After these no set will come: a refusal (the coordinator does not count this peer as a member)
// or a Finished without linger (it released its members, or answers a non-member so). A
// Finished with linger goes to members, whose GetFinalized the coordinator still answers.
bool ends_catch_up(const wire::Envelope& m) {
  return m.has_refused() || (m.has_finished() && !m.finished().linger());
}

}  // namespace

bool Round::catch_up(uint64_t target, std::deque<wire::Envelope>& deferred) {
  bool warned_full = false;
  while (peer_.applied < target) {
    if (peer_.stopping()) return false;
    const uint64_t step = peer_.applied;
    if (finalized_.count(step) != 0) {
      apply(step);
      continue;
    }
    const auto first_asked = Clock::now();
    // How long the coordinator has answered something in every interval between asks.
    Clock::duration answering{};
    for (int asks = 1; finalized_.count(step) == 0; ++asks) {
      wire::Envelope ask;
      ask.mutable_get_finalized()->set_step(step);
      peer_.link.send_to_coordinator(ask);
      const auto asked = Clock::now();
      bool heard = false;
      while (finalized_.count(step) == 0 && Clock::now() - asked < kAskAgain) {
        if (peer_.stopping()) return false;
        PeerMetrics::Timer waiting(peer_.metrics, PeerMetrics::Activity::kWaiting);
        auto m = peer_.link.next_from_coordinator(0.2);
        waiting.stop();
        if (!m) continue;
        heard = true;
        if (handle_passive(*m)) continue;
        if (deferred.size() >= kMaxDeferred) {
          if (!warned_full) {
            warned_full = true;
            obs::log_warn({peer_.applied,
                           peer_.who,
                           "deferred_dropped",
                           {{"kind", net::kind_name(deferred.front())},
                            {"limit", static_cast<uint64_t>(kMaxDeferred)}}},
                          fmt::format("{} coordinator messages wait while catching up: the "
                                      "oldest are dropped",
                                      kMaxDeferred));
          }
          deferred.pop_front();
        }
        const bool ends = ends_catch_up(*m);
        deferred.push_back(std::move(*m));
        if (ends) return false;  // the caller acts on it next
      }
      if (finalized_.count(step) != 0) break;
      const auto now = Clock::now();
      answering = heard ? answering + (now - asked) : Clock::duration{};
      const double waited = std::chrono::duration<double>(now - first_asked).count();
      if (answering >= kSetStall) {
        fail(
            "step {}: the coordinator answers but has not sent the step's finalized set in "
            "{:.0f} s ({} requests); without it the peer cannot apply the run's steps (a "
            "coordinator that lost finalized steps? check its log and state_db)",
            step, waited, asks);
      }
      obs::log_warn(
          {peer_.applied,
           peer_.who,
           "catch_up_stalled",
           {{"round", step},
            {"target", target},
            {"requests", static_cast<int64_t>(asks)},
            {"waited_seconds", waited},
            {"coordinator_answering", heard}}},
          fmt::format("step {}: no finalized set from the coordinator after {:.0f} s "
                      "({}); asking again",
                      step, waited, heard ? "it answers other messages" : "it is silent"));
    }
  }
  return true;
}

void Round::apply(uint64_t step) {
  PeerMetrics::Timer timer(peer_.metrics, PeerMetrics::Activity::kApplying);
  const auto& set = finalized_.at(step);
  const auto missing = peer_.link.ensure(step, set, peer_.members, 120);
  if (!missing.empty()) {
    fail("step {}: {} finalized payload(s) could not be fetched from any member", step,
         missing.size());
  }
  std::vector<Contribution> contributions;
  for (const auto& record : set) {
    // The blob store holds a payload only under its checked hash: the key to its decoded form.
    contributions.push_back({net::key_to_hex(record.author()),
                             *peer_.link.blobs().get(record.payload_hash()),
                             record.payload_hash()});
  }
  const StepContext context{static_cast<int64_t>(step),
                            peer_.config.learning_rate(static_cast<int64_t>(step)),
                            static_cast<int64_t>(std::max<size_t>(1, set.size()))};
  const auto apply_started = Clock::now();
  if (!contributions.empty()) report(step, peer_.learner.strategy->apply(context, contributions));
  if (peer_.first_round) {
    peer_.summary.compute_seconds +=
        std::chrono::duration<double>(Clock::now() - apply_started).count();
  }
  ++peer_.applied;
  if (verification_.enabled()) verification_.keep_parameters();
  finalized_.erase(finalized_.begin(), finalized_.lower_bound(peer_.applied));
  collected_.erase(collected_.begin(), collected_.lower_bound(peer_.applied));
  timer.stop();  // a checkpoint written by settle() counts as checkpointing
  settle();
}

void Round::report(uint64_t step, const ApplyReport& report) {
  // Every honest peer decides the same from the same bytes, so each says the same thing here.
  for (const ApplyReport::Refusal& r : report.refused) {
    peer_.log(fmt::format("step {}: the finalized contribution of {} is left out: {}", step,
                          r.peer.substr(0, 8), r.reason),
              "contribution_refused", {{"round", step}, {"author", r.peer}, {"reason", r.reason}});
  }
  if (report.clipped > 0 || report.skipped) {
    peer_.log(fmt::format("step {}: {} contribution tensor(s) scaled down to the influence bound{}",
                          step, report.clipped,
                          report.skipped ? "; the update was not finite and was not applied" : ""),
              "influence_bound",
              {{"round", step}, {"clipped", report.clipped}, {"skipped", report.skipped}});
  }
  peer_.metrics.apply_decisions(report.refused.size(), static_cast<uint64_t>(report.clipped),
                                report.skipped);
  peer_.summary.payloads_predecoded += static_cast<uint64_t>(report.predecoded);
}

void Round::settle(bool force_report) {
  const auto& n = peer_.config.network;
  if (force_report || peer_.applied % static_cast<uint64_t>(n.hash_interval) == 0) {
    report_state(peer_);
  }
  const uint64_t keep = 4 * static_cast<uint64_t>(n.hash_interval) + 16;
  if (peer_.applied > keep) peer_.link.blobs().prune_below(peer_.applied - keep);
  checkpointer_.after_apply();
  peer_.link.set_status(peer_.applied, peer_.next_round);
  peer_.metrics.applied(peer_.applied);
}

void Round::train(const wire::RoundStart& round) {
  const uint64_t step = round.step();
  peer_.members.assign(round.members().begin(), round.members().end());
  offer_data_peers(peer_, peer_.members);
  std::vector<SequenceRange> share;
  for (const auto& r : round.assignment()) share.push_back({r.first(), r.count()});
  int64_t total = 0;
  for (const SequenceRange& r : share) total += static_cast<int64_t>(r.count);
  if (total == 0) return;  // no share this round (the batch is smaller than the membership)
  const std::optional<double> val_loss = checkpointer_.validate(step);
  const auto started = Clock::now();
  const auto index = static_cast<int64_t>(step);
  const StepContext context{index, peer_.config.learning_rate(index),
                            static_cast<int64_t>(std::max<size_t>(1, peer_.members.size()))};
  // Every member switches at the same step: the step, not the member, decides the phase.
  if (index == peer_.config.tst_switch_step() && step > 0) {
    peer_.log(
        fmt::format("step {:>5}  token superposition ends: next-token training from here on", step),
        "tst_switch", {{"round", step}});
  }
  const bool verified = verification_.enabled();
  if (verified) verification_.before_step();
  StepResult result;
  {
    const CheatPerturbation cheat(peer_.learner.params);
    result = peer_.step->run(peer_.learner, context, cheat_share(share), &peer_.stop);
  }
  if (!result.completed) return;
  double compute = result.compute_seconds;
  // --slowdown stands for slower hardware: the sleep counts as compute.
  if (peer_.options.slowdown > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>((peer_.options.slowdown - 1.0) * compute));
    compute *= peer_.options.slowdown;
  }
  Contribution& own = result.contribution;
  const std::string hash = blake2b256_bytes(own.bytes);
  peer_.link.blobs().put(hash, own.bytes, step);
  wire::Envelope commit;
  auto* c = commit.mutable_commit();
  c->mutable_record()->set_author(peer_.identity.public_key());
  c->mutable_record()->set_step(step);
  c->mutable_record()->set_payload_hash(hash);
  c->mutable_record()->set_signature(
      peer_.identity.sign(net::commit_signing_bytes(peer_.run_id, step, hash)));
  c->set_sequences(static_cast<uint64_t>(total));
  c->set_compute_seconds(compute);
  c->set_loss(result.loss);
  c->set_payload_bytes(own.bytes.size());
  if (val_loss) c->set_val_loss(*val_loss);
  const double bookkeeping = verified ? verification_.after_step(*c) : 0.0;
  peer_.link.send_to_coordinator(commit);
  last_commit_ = commit;
  upload_if_relayed(hash, own.bytes);
  const auto committed = Clock::now();
  peer_.summary.compute_seconds += std::chrono::duration<double>(committed - started).count();
  peer_.summary.wall_seconds =
      std::chrono::duration<double>(committed - *peer_.first_round).count();
  ++peer_.summary.rounds_trained;
  peer_.metrics.round_trained(result.loss, context.lr, static_cast<uint64_t>(total),
                              static_cast<uint64_t>(peer_.config.train.batch_size),
                              peer_.config.data.seq_len, compute);
  peer_.log(fmt::format("step {:>5}  loss {:.4f}  {} seqs  {:.2f} s  payload {} B", step,
                        result.loss, total, compute, own.bytes.size()),
            "trained",
            {{"round", step},
             {"loss", result.loss},
             {"sequences", total},
             {"seconds", compute},
             {"payload_bytes", static_cast<uint64_t>(own.bytes.size())},
             {"grad_norm", result.grad_norm},
             {"verify_seconds", bookkeeping}});
}

void Round::upload_if_relayed(const std::string& hash, const std::string& bytes) {
  const bool relayed = std::any_of(peer_.members.begin(), peer_.members.end(), [&](const auto& m) {
    return m.key() == peer_.identity.public_key() && m.relayed();
  });
  if (relayed != relayed_) {
    relayed_ = relayed;
    peer_.log(relayed ? "nobody can dial this peer's endpoint: its payloads go through the "
                        "coordinator's relay"
                      : "this peer's endpoint answers again: no relay",
              "relayed", {{"relayed", relayed}});
  }
  if (!relayed) return;
  if (bytes.size() > net::kMaxRelayedBlobBytes) {
    // The relay refuses it: nobody will hold this payload, so the step goes on without it.
    if (!warned_relay_size_) {
      warned_relay_size_ = true;
      obs::log_warn({peer_.applied,
                     peer_.who,
                     "relay_too_large",
                     {{"payload_bytes", static_cast<uint64_t>(bytes.size())},
                      {"limit_bytes", static_cast<uint64_t>(net::kMaxRelayedBlobBytes)}}},
                    fmt::format("this peer's payloads ({} bytes) are larger than the coordinator "
                                "relays ({} bytes): they reach nobody while nobody can dial "
                                "this peer; make its --advertise endpoint reachable",
                                bytes.size(), net::kMaxRelayedBlobBytes));
    }
    return;
  }
  wire::Envelope upload;
  upload.mutable_blob()->set_hash(hash);
  upload.mutable_blob()->set_data(bytes);
  peer_.link.send_to_coordinator(upload);
  peer_.summary.relayed_bytes += bytes.size();
}

void Round::recommit(uint64_t round) {
  if (last_commit_ && last_commit_->commit().record().step() == round) {
    peer_.link.send_to_coordinator(*last_commit_);
  }
}

}  // namespace agora::peer
