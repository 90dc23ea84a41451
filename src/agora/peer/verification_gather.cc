// Verification, the verifier's gathering of a check's inputs (verification.h): the payload,
// and from the author the manifests of its two states and the tensors of the check's sample.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/peer/state_sample.h"
#include "agora/peer/verification.h"

namespace agora::peer {

namespace {

// The longest one fetch from the author may take.
constexpr double kFetchSeconds = 20;

// The served tensor `name` as a tensor shaped like this model's.
torch::Tensor tensor_of(const Snapshot& served, const std::string& name,
                        const torch::Tensor& model) {
  const auto it = served.find(name);
  if (it == served.end()) fail("the served state has no tensor {}", name);
  const TensorBytes& t = it->second;
  if (t.data.size() != static_cast<size_t>(model.numel()) * sizeof(float)) {
    fail("the served tensor {} has {} bytes; this model's has {}", name, t.data.size(),
         static_cast<size_t>(model.numel()) * sizeof(float));
  }
  return torch::from_blob(const_cast<char*>(t.data.data()), model.sizes(), torch::kFloat32).clone();
}

}  // namespace

std::optional<wire::Verdict> Verification::gather(Queued queued, Gathered& out) {
  out.queued = std::move(queued);
  const wire::SpotCheck& c = out.queued.check;
  wire::Verdict v;
  const auto abstain = [&](std::string why) {
    v.set_outcome(wire::Verdict::ABSTAINS);
    v.set_reason(std::move(why));
    return v;
  };
  const auto disagree = [&](std::string why) {
    v.set_outcome(wire::Verdict::DISAGREES);
    v.set_reason(std::move(why));
    return v;
  };
  // The check comes with the step's Collect: the payload may still be on its way here.
  std::optional<std::string> payload = peer_.link.blobs().get(c.payload_hash());
  const auto wait_until = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(peer_.config.network.witness_seconds);
  while (!payload && !stopping_ && std::chrono::steady_clock::now() < wait_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    payload = peer_.link.blobs().get(c.payload_hash());
  }
  if (!payload) return abstain("this verifier does not hold the payload");
  if (c.author().relayed()) return abstain("nobody can dial the author to fetch its state");
  out.payload = std::move(*payload);
  // Within what is left of verify.seconds: an author that left must not hold up the queue.
  const auto time_left = [&] {
    return std::clamp(peer_.config.verify.seconds - seconds_since(out.queued.received), 1.0,
                      kFetchSeconds);
  };
  // Runs one fetch from the author: a verdict when it failed.
  const auto fetch_failed =
      [&](const std::string& hash,
          const std::function<void()>& fetch) -> std::optional<wire::Verdict> {
    try {
      fetch();
    } catch (const StateNotServed& e) {
      // It answered, and does not hold what it committed to (an honest author keeps its states
      // longer than the coordinator keeps a check open).
      return disagree(
          fmt::format("the author did not serve the strategy state {} it committed to: {}",
                      short_hex(hash), e.what()));
    } catch (const std::exception& e) {
      if (stopping_) throw;  // this peer is leaving: no verdict
      // No answer in time may be the network's doing, or this verifier's backlog: no evidence.
      return abstain(fmt::format("the author's strategy state {} did not arrive: {}",
                                 short_hex(hash), e.what()));
    }
    return std::nullopt;
  };
  // Each state's manifest first (it hashes to the commitment and holds every tensor's hash, in
  // name order), then only the tensors of the check's sample.
  const std::string* hashes[2] = {&c.strategy_before(), &c.strategy_after()};
  std::string manifests[2];
  const size_t count = momentum_like_.size();
  for (int i = 0; i < 2; ++i) {
    if (auto failed = fetch_failed(*hashes[i], [&] {
          manifests[i] =
              peer_.link.fetch_strategy_manifest(*hashes[i], c.author(), time_left(), &stopping_);
        })) {
      return failed;
    }
    out.state_bytes += manifests[i].size();
    if (manifests[i].size() != 32 * count) {
      return disagree(fmt::format(
          "the manifest of the strategy state {} holds {} bytes; this model's state has {} "
          "tensors, 32 bytes each",
          short_hex(*hashes[i]), manifests[i].size(), count));
    }
  }
  std::vector<StateTensor> tensors;
  for (const std::string& name : momentum_names_) {
    tensors.push_back({name, static_cast<uint64_t>(momentum_like_.at(name).numel()) * 4});
  }
  out.sampled = sample_state(c.sample(), tensors, peer_.config.verify.state_fraction);
  std::vector<std::string> names;
  for (size_t i : out.sampled) names.push_back(momentum_names_[i]);
  std::map<std::string, size_t> position;  // in the manifests
  for (const auto& [name, like] : momentum_like_) position.emplace(name, position.size());
  std::map<std::string, torch::Tensor>* states[2] = {&out.before, &out.after};
  for (int i = 0; i < 2; ++i) {
    Snapshot served;
    if (auto failed = fetch_failed(*hashes[i], [&] {
          served = peer_.link.fetch_strategy_state(*hashes[i], names, c.author(), time_left(),
                                                   &stopping_);
        })) {
      return failed;
    }
    for (const std::string& name : names) {
      const auto it = served.find(name);
      const std::string_view expected =
          std::string_view(manifests[i]).substr(32 * position.at(name), 32);
      if (it == served.end() || blake2b256_bytes(it->second.data) != expected) {
        return disagree(
            fmt::format("the tensor {} the author served of its strategy state {} does not "
                        "hash to the state's manifest",
                        name, short_hex(*hashes[i])));
      }
      out.state_bytes += it->second.data.size();
      try {
        (*states[i])[name] = tensor_of(served, name, momentum_like_.at(name));
      } catch (const std::exception& e) {
        return disagree(e.what());
      }
    }
  }
  // The recomputation needs every tensor's momentum; those outside the sample are not compared.
  for (const auto& [name, like] : momentum_like_) {
    if (!out.before.contains(name)) out.before[name] = torch::zeros_like(like);
  }
  out.ready_at = std::chrono::steady_clock::now();
  return std::nullopt;
}

uint64_t Verification::whole_state_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [name, t] : momentum_like_) bytes += static_cast<uint64_t>(t.numel()) * 4 + 32;
  return 2 * bytes;
}

}  // namespace agora::peer
