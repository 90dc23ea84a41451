// The adversary's floods and oversized frames (adversary.h: attacks flood and oversized).
#include <fmt/format.h>

#include <algorithm>

#include "adversary.h"
#include "agora/core/error.h"

namespace agora::adversary {
namespace {

std::string random_hash(std::mt19937_64& rng) {
  std::string out(32, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

// Hands `bytes` to ZeroMQ without blocking; false when its queue is full.
bool send_raw(zmq::socket_t& socket, const std::string& bytes) {
  try {
    return socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

}  // namespace

void Adversary::flood_tick() {
  if (o_.attack != "flood" || flood_done_) return;
  const double t = now();
  if (t < joined_at_ + o_.flood_after) return;
  if (flood_start_ < 0) {
    flood_start_ = t;
    report_.emit("flood_start", {{"kind", o_.flood_kind},
                                 {"rate", o_.rate},
                                 {"seconds", o_.flood_seconds},
                                 {"members", members_.size()}});
  }
  if (t - flood_start_ >= o_.flood_seconds) {
    flood_done_ = true;
    report_.emit("flood", {{"kind", o_.flood_kind},
                           {"sent", flood_sent_},
                           {"seconds", t - flood_start_},
                           {"per_second", double(flood_sent_) / (t - flood_start_)}});
    return;
  }
  const uint64_t due = o_.rate > 0 ? static_cast<uint64_t>((t - flood_start_) * o_.rate) : ~0ull;
  const bool to_peers = o_.flood_kind == "get-blob" || o_.flood_kind == "get-tensor" ||
                        o_.flood_kind == "get-strategy";
  if (to_peers && members_.empty()) return;
  std::vector<std::pair<std::string, std::string>> targets(members_.begin(), members_.end());
  for (int burst = 0; burst < 200 && flood_sent_ < due; ++burst) {
    wire::Envelope e;
    const std::string& kind = o_.flood_kind;
    if (kind == "heartbeat") {
      e.mutable_heartbeat()->set_applied_steps(finalized_);
      e.mutable_heartbeat()->set_next_round(next_round_);
    } else if (kind == "get-finalized") {
      e.mutable_get_finalized()->set_step(0);
    } else if (kind == "join") {
      e.mutable_join()->set_key(identity_.public_key());
      e.mutable_join()->set_endpoint(endpoint_);
      e.mutable_join()->set_agent("agora-adversary (flood)");
    } else if (kind == "witness") {
      // One Witness, repeated, with many rejections of the members (event rows on disk).
      auto* w = e.mutable_witness();
      w->set_step(collecting_.empty() ? finalized_ : collecting_.rbegin()->first);
      for (int i = 0; i < 1000 && !targets.empty(); ++i) {
        auto* r = w->add_rejected();
        r->set_author(targets[static_cast<size_t>(i) % targets.size()].first);
        r->set_reason("flood");
      }
    } else if (kind == "state-report") {
      // A new applied-step count and hash each time: every one is a distinct record.
      auto* s = e.mutable_state_report()->mutable_state();
      s->set_applied_steps(finalized_ + flood_sent_);
      s->set_state_hash(random_hash(rng_));
    } else if (kind == "commit") {
      // Signed commits for future steps (the coordinator keeps commits per step).
      const uint64_t step = next_round_ + 1000 + flood_sent_;
      const std::string hash = random_hash(rng_);
      auto* c = e.mutable_commit();
      c->mutable_record()->set_author(identity_.public_key());
      c->mutable_record()->set_step(step);
      c->mutable_record()->set_payload_hash(hash);
      c->mutable_record()->set_signature(
          identity_.sign(net::commit_signing_bytes(run_id_, step, hash)));
      c->set_strategy_before(random_hash(rng_));
      c->set_strategy_after(random_hash(rng_));
      c->set_strategy_signature(identity_.sign(net::strategy_signing_bytes(
          run_id_, step, hash, 0, c->strategy_before(), c->strategy_after())));
      c->set_sequences(1);
      c->set_compute_seconds(1);
    } else if (kind == "get-blob") {
      // The newest honest payload makes every answer a full copy; else an unknown hash.
      e.mutable_get_blob()->set_hash(honest_.empty() ? random_hash(rng_) : honest_.back().hash);
    } else if (kind == "get-tensor") {
      const auto k = static_cast<uint64_t>(std::max<int64_t>(1, config_->network.hash_interval));
      e.mutable_get_tensor()->set_applied_steps(finalized_ / k * k);
      e.mutable_get_tensor()->set_name(parameter_shapes(config_->model).front().name);
    } else if (kind == "get-strategy") {
      // Strategy states nobody committed to: each answered NotFound, within the rate limits.
      e.mutable_get_tensor()->set_strategy_hash(random_hash(rng_));
      e.mutable_get_tensor()->set_name("delta." + parameter_shapes(config_->model).front().name);
    } else if (kind == "verdict") {
      // Verdicts nobody asked for, each accusing another member of a recent step.
      auto* v = e.mutable_verdict();
      v->set_step(next_round_ > 0 ? next_round_ - 1 : 0);
      v->set_author(honest_.empty() ? random_hash(rng_) : honest_.back().author);
      v->set_outcome(wire::Verdict::DISAGREES);
    } else {
      fail(
          "--flood-kind {}: expected heartbeat, get-finalized, join, witness, state-report, "
          "commit, verdict, get-blob, get-tensor or get-strategy",
          kind);
    }
    const std::string bytes = net::encode_envelope(e);
    bool sent;
    if (to_peers) {
      const auto& [key, endpoint] = targets[flood_sent_ % targets.size()];
      sent = send_raw(client_for(endpoint, key).socket(), bytes);
    } else {
      sent = send_raw(coordinator_->socket(), bytes);
    }
    if (!sent) break;  // the queue is full: come back after reading what arrived
    ++flood_sent_;
  }
}

void Adversary::oversized() {
  if (o_.attack != "oversized" || oversized_done_) return;
  const double t = now();
  if (t < joined_at_ + o_.flood_after) return;
  if (flood_start_ < 0) flood_start_ = t - 1;  // the first frame goes out at once
  if (t - flood_start_ < 1.0) return;          // one frame a second
  if (t - joined_at_ - o_.flood_after > o_.flood_seconds) {
    oversized_done_ = true;
    return;
  }
  flood_start_ = t;
  wire::Envelope e;
  if (o_.target == "coordinator") {
    // A control message padded to `bytes` (the coordinator allows 1 MiB).
    auto* w = e.mutable_witness();
    w->set_step(finalized_);
    auto* r = w->add_rejected();
    r->set_author(identity_.public_key());
    r->set_reason(std::string(o_.bytes, 'x'));
    const bool sent = send_raw(coordinator_->socket(), net::encode_envelope(e));
    report_.emit("oversized", {{"target", "coordinator"}, {"bytes", o_.bytes}, {"sent", sent}});
  } else {
    // An unsolicited Blob of `bytes` to every member's server (they allow 1 GiB).
    e.mutable_blob()->set_hash(random_hash(rng_));
    e.mutable_blob()->set_data(std::string(o_.bytes, 'x'));
    const std::string bytes = net::encode_envelope(e);
    for (const auto& [key, endpoint] : members_) {
      const bool sent = send_raw(client_for(endpoint, key).socket(), bytes);
      report_.emit("oversized",
                   {{"target", net::short_key(key)}, {"bytes", bytes.size()}, {"sent", sent}});
    }
  }
}

}  // namespace agora::adversary
