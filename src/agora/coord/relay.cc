#include "agora/coord/relay.h"

#include <fmt/format.h>

#include <algorithm>

#include "agora/core/hash.h"
#include "agora/obs/log.h"

namespace agora::coord {

std::optional<uint64_t> committed_step(const RunState& state, const net::PublicKey& author,
                                       const std::string& hash) {
  if (state.round) {
    const auto it = state.round->commits.find(author);
    if (it != state.round->commits.end() && it->second.payload_hash == hash) {
      return state.round->step;
    }
  }
  for (const auto& [step, collecting] : state.collecting) {
    for (const CommitRecord& c : collecting.commits) {
      if (c.author == author && c.payload_hash == hash) return step;
    }
  }
  return std::nullopt;
}

std::string RelayStore::put(const net::PublicKey& author, uint64_t step, const std::string& hash,
                            std::string data) {
  (void)author;  // the caller checked that `hash` is the author's commitment
  if (blobs_.contains(hash)) return "";  // a repeat upload changes nothing
  if (data.size() > limits_.max_blob_bytes) {
    return fmt::format("the payload has {} bytes; the relay carries at most {}", data.size(),
                       limits_.max_blob_bytes);
  }
  if (blake2b256_bytes(data) != hash) return "the bytes do not hash to the commitment";
  // Full: the oldest steps' blobs make room for a newer step's (only a member far behind still
  // wants those); a step's own blobs never push each other out.
  while (held_ + data.size() > limits_.max_bytes) {
    auto oldest = std::min_element(blobs_.begin(), blobs_.end(), [](const auto& a, const auto& b) {
      return a.second.step < b.second.step;
    });
    if (oldest == blobs_.end() || oldest->second.step >= step) {
      return fmt::format("the relay holds {} bytes of this step and newer ones, its limit is {}",
                         held_, limits_.max_bytes);
    }
    held_ -= oldest->second.data->size();
    blobs_.erase(oldest);
  }
  held_ += data.size();
  in_ += data.size();
  bytes_by_step_[step] += data.size();
  Blob blob;
  blob.step = step;
  blob.data = std::make_shared<const std::string>(std::move(data));
  blobs_.emplace(hash, std::move(blob));
  return "";
}

std::shared_ptr<const std::string> RelayStore::get(const net::PublicKey& who,
                                                   const std::string& hash) {
  auto it = blobs_.find(hash);
  if (it == blobs_.end()) return nullptr;
  int& fetches = it->second.fetches[who];
  if (fetches >= limits_.fetches_per_member) return nullptr;
  ++fetches;
  out_ += it->second.data->size();
  bytes_by_step_[it->second.step] += it->second.data->size();
  return it->second.data;
}

void RelayStore::prune(uint64_t finalized_steps) {
  const uint64_t below =
      finalized_steps > limits_.keep_steps ? finalized_steps - limits_.keep_steps : 0;
  std::erase_if(blobs_, [&](const auto& item) {
    if (item.second.step >= below) return false;
    held_ -= item.second.data->size();
    return true;
  });
  bytes_by_step_.erase(bytes_by_step_.begin(), bytes_by_step_.lower_bound(below));
}

uint64_t RelayStore::bytes_for_step(uint64_t step) const {
  const auto it = bytes_by_step_.find(step);
  return it == bytes_by_step_.end() ? 0 : it->second;
}

namespace {
bool current(const RunState& state, const net::PublicKey& key) {
  const auto it = state.members.find(key);
  return it != state.members.end() &&
         (it->second.state == MemberState::kActive || it->second.state == MemberState::kSyncing);
}
}  // namespace

void Relay::upload(const StateMachine& machine, const net::PublicKey& from,
                   const wire::Blob& blob) {
  std::string why = "its author is not relayed";
  if (machine.is_relayed(from)) {
    const std::optional<uint64_t> step = committed_step(machine.state(), from, blob.hash());
    why = step ? store_.put(from, *step, blob.hash(), blob.data())
               : "it is no commitment of its author for a step not yet final";
  }
  if (!why.empty()) {
    ++refused_;
    refused_why_ = why;
  }
}

wire::Envelope Relay::fetch(const RunState& state, const net::PublicKey& from,
                            const wire::GetBlob& request) {
  std::shared_ptr<const std::string> data;
  if (current(state, from)) data = store_.get(from, request.hash());
  wire::Envelope reply;
  if (data) {
    reply.mutable_blob()->set_hash(request.hash());
    reply.mutable_blob()->set_data(*data);
  } else {
    reply.mutable_not_found()->set_what("not in the coordinator's relay");
  }
  return reply;
}

std::optional<std::vector<RelayOutgoing>> Relay::handle(const StateMachine& machine,
                                                        const net::PublicKey& from,
                                                        const std::string& route,
                                                        const wire::Envelope& message, double now) {
  if (message.has_get_blob()) {
    return std::vector<RelayOutgoing>{
        RelayOutgoing{route, {}, fetch(machine.state(), from, message.get_blob())}};
  }
  if (message.has_blob()) {
    upload(machine, from, message.blob());
    return std::vector<RelayOutgoing>{};
  }
  if (message.has_get_tensor()) {
    return fetch_tensor(machine, from, route, message.get_tensor(), now);
  }
  if (message.has_tensor_data()) return tensor_answer(from, message.tensor_data(), now);
  return std::nullopt;
}

std::vector<RelayOutgoing> Relay::fetch_tensor(const StateMachine& machine,
                                               const net::PublicKey& from, const std::string& route,
                                               const wire::GetTensor& get, double now) {
  const bool holder_relayed =
      current(machine.state(), get.holder()) && machine.is_relayed(get.holder());
  std::vector<RelayOutgoing> out =
      tensors_.request(from, route, get, current(machine.state(), from), holder_relayed, now);
  // Forwarded at once when the pace allows, not at the next tick.
  for (auto& o : tensors_.pump(now)) out.push_back(std::move(o));
  return out;
}

std::vector<RelayOutgoing> Relay::tensor_answer(const net::PublicKey& from,
                                                const wire::TensorData& data, double now) {
  std::vector<RelayOutgoing> out = tensors_.answer(from, data, now);
  for (auto& o : tensors_.pump(now)) out.push_back(std::move(o));  // the holder has room again
  return out;
}

Actions Relay::check_reachability(StateMachine& machine, double now) {
  for (const auto& [key, m] : machine.state().members) {
    if (!current(machine.state(), key)) continue;
    const auto probed = probed_.find(key);
    const auto due = reprobe_at_.find(key);
    if (probed == probed_.end() || probed->second != m.endpoint ||
        (due != reprobe_at_.end() && now >= due->second)) {
      prober_.probe(key, m.endpoint);
      if (probed == probed_.end() || probed->second != m.endpoint) machine.set_probing(key);
      probed_[key] = m.endpoint;
      reprobe_at_.erase(key);
    }
  }
  Actions out;
  for (const ProbeResult& r : prober_.results()) {
    const auto it = machine.state().members.find(r.key);
    if (it == machine.state().members.end() || it->second.endpoint != r.endpoint) continue;
    if (!r.reachable) reprobe_at_[r.key] = now + kReprobeSeconds;
    Actions a = machine.set_relayed(
        r.key, !r.reachable,
        r.reachable
            ? fmt::format("a probe of {} answered in {:.2f} s", r.endpoint, r.seconds)
            : fmt::format("a probe of {} got no answer in {:.0f} s", r.endpoint, kProbeSeconds),
        now);
    for (auto& o : a.send) out.send.push_back(std::move(o));
    for (auto& l : a.log) out.log.push_back(std::move(l));
  }
  return out;
}

void Relay::sweep(const RunState& state) {
  std::erase_if(probed_, [&](const auto& item) { return !state.members.contains(item.first); });
  std::erase_if(reprobe_at_, [&](const auto& item) { return !state.members.contains(item.first); });
  const TensorRelay::Counters& t = tensors_.counters();
  if (t.chunks != tensors_reported_.chunks || t.refused != tensors_reported_.refused ||
      t.expired != tensors_reported_.expired || t.unsolicited != tensors_reported_.unsolicited) {
    const TensorRelay::Counters& was = tensors_reported_;
    obs::log_info({state.finalized_steps(),
                   "",
                   "relay_tensors",
                   {{"chunks", t.chunks - was.chunks},
                    {"bytes_in", t.bytes_in - was.bytes_in},
                    {"bytes_out", t.bytes_out - was.bytes_out},
                    {"refused", t.refused - was.refused},
                    {"expired", t.expired - was.expired},
                    {"unsolicited", t.unsolicited - was.unsolicited}}},
                  fmt::format("relayed {} chunks of model state ({} bytes in, {} out) since the "
                              "last report; {} refused (last: {}), {} unanswered, {} unsolicited",
                              t.chunks - was.chunks, t.bytes_in - was.bytes_in,
                              t.bytes_out - was.bytes_out, t.refused - was.refused,
                              tensors_.last_refusal().empty() ? "none" : tensors_.last_refusal(),
                              t.expired - was.expired, t.unsolicited - was.unsolicited));
    tensors_reported_ = t;
  }
  if (refused_ == 0) return;
  obs::log_warn({state.finalized_steps(), "", "relay_refused", {{"uploads", refused_}}},
                fmt::format("the relay kept none of {} uploads since the last report (last: {})",
                            refused_, refused_why_));
  refused_ = 0;
}

}  // namespace agora::coord
