// The model state of members nobody can dial, through the coordinator's relay
// (coord/tensor_relay.h): the holder's answers, on the I/O thread, and the fetcher's chunked
// fetch, on the training thread.
#include <fmt/format.h>

#include <algorithm>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/peer/peer_network.h"
#include "agora/peer/peer_network_detail.h"

namespace agora::peer {

using detail::now_seconds;
using detail::printable;

namespace {

// Chunks asked at once: the relay keeps at most this many of one member's requests waiting
// (TensorRelay::Limits::per_fetcher).
constexpr size_t kChunksAtOnce = 16;
// Per chunk: longer than the relay waits for the holder (30 s), so its NotFound comes first.
constexpr double kChunkTimeoutSeconds = 45;

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace

void PeerNetwork::answer_relayed(const wire::GetTensor& get) {
  wire::Envelope e;
  auto* d = e.mutable_tensor_data();
  d->set_applied_steps(get.applied_steps());
  d->set_strategy_hash(get.strategy_hash());
  d->set_name(get.name());
  d->set_offset(get.offset());
  d->set_holder(identity_.public_key());
  const std::shared_ptr<const Snapshot> snapshot = find_snapshot(get);
  const TensorBytes* t = nullptr;
  if (snapshot) {
    const auto it = snapshot->find(get.name());
    if (it != snapshot->end()) t = &it->second;
  }
  const bool fits = t != nullptr && get.length() > 0 &&
                    get.length() <= net::kMaxRelayedChunkBytes &&
                    (get.offset() < t->data.size() || (get.offset() == 0 && t->data.empty()));
  if (!fits) {
    d->set_missing(true);
  } else {
    d->set_dtype(t->dtype);
    for (int64_t dim : t->shape) d->add_shape(dim);
    d->set_total_bytes(t->data.size());
    d->set_data(t->data.substr(get.offset(), get.length()));
    bump(&NetworkCounters::relay_chunks_served);
  }
  count(Traffic::kState, true, e.ByteSizeLong());
  coordinator_->send(e);
}

void PeerNetwork::fetch_relayed(const wire::StateRecord& state, std::vector<int> indices,
                                const std::vector<wire::Member>& holders, double timeout_seconds,
                                Snapshot& out) {
  wire::Member relay;
  relay.set_key(options_.coordinator_key);
  relay.set_endpoint(options_.coordinator);
  uint64_t largest = 0;
  {
    MutexLock lock(mutex_);
    largest = settings_.max_tensor_bytes > 0 ? settings_.max_tensor_bytes : reply_limits_.max_data;
  }
  const uint64_t chunk = net::kMaxRelayedChunkBytes;
  const double end = now_seconds() + timeout_seconds;
  const auto chunk_want = [&](int index, const wire::Member& holder, uint64_t offset) {
    Want want;
    const std::string& name = state.tensor_names(index);
    want.key = net::relayed_chunk_what(name, offset);
    want.timeout = kChunkTimeoutSeconds;
    want.retry_refused = true;  // a joiner is a current member from its Welcome on
    want.sources = {relay};
    auto* get = want.request.mutable_get_tensor();
    get->set_applied_steps(state.applied_steps());
    get->set_name(name);
    get->set_holder(holder.key());
    get->set_offset(offset);
    get->set_length(chunk);
    return want;
  };
  std::map<int, std::string> why;  // the last failure of each tensor still missing
  // Tensor k starts at holder k; one that fails (a holder that lies, or lost it) goes on to the
  // next holder.
  for (size_t attempt = 0; attempt < holders.size() && !indices.empty(); ++attempt) {
    const auto holder_of = [&](size_t k) -> const wire::Member& {
      return holders[(k + attempt) % holders.size()];
    };
    std::vector<Want> firsts;
    for (size_t k = 0; k < indices.size(); ++k) {
      firsts.push_back(chunk_want(indices[k], holder_of(k), 0));
    }
    fetch_batched(firsts, kChunksAtOnce, std::max(0.0, end - now_seconds()));
    // The first chunk tells the size; the rest are asked of the same holder.
    std::vector<Want> rest;
    std::vector<size_t> rest_of;  // which entry of `indices` each of `rest` belongs to
    for (size_t k = 0; k < indices.size(); ++k) {
      const Want& first = firsts[k];
      if (!first.ok) {
        why[indices[k]] = first.reason.empty() ? "the relay did not answer" : first.reason;
        continue;
      }
      if (first.total_bytes > largest) {
        why[indices[k]] = fmt::format("its holder says it has {} bytes; the run's largest is {}",
                                      first.total_bytes, largest);
        continue;
      }
      for (uint64_t offset = chunk; offset < first.total_bytes; offset += chunk) {
        rest.push_back(chunk_want(indices[k], holder_of(k), offset));
        rest_of.push_back(k);
      }
    }
    if (!rest.empty()) fetch_batched(rest, kChunksAtOnce, std::max(0.0, end - now_seconds()));
    std::vector<int> still;
    for (size_t k = 0; k < indices.size(); ++k) {
      const int index = indices[k];
      Want& first = firsts[k];
      if (!first.ok || first.total_bytes > largest) {
        still.push_back(index);
        continue;
      }
      TensorBytes tensor = std::move(first.tensor);
      uint64_t chunks = 1;
      tensor.data.reserve(first.total_bytes);
      std::string wrong;
      for (size_t r = 0; r < rest.size() && wrong.empty(); ++r) {
        if (rest_of[r] != k) continue;
        if (!rest[r].ok) {
          wrong = rest[r].reason.empty() ? "a chunk did not arrive" : rest[r].reason;
        } else if (rest[r].total_bytes != first.total_bytes) {
          wrong = "its chunks disagree on its size";
        } else {
          tensor.data += rest[r].tensor.data;
          ++chunks;
        }
      }
      {
        MutexLock lock(mutex_);
        counters_.relay_chunks_fetched += chunks;
      }
      if (wrong.empty() && tensor.data.size() != first.total_bytes) {
        wrong = fmt::format("its chunks hold {} bytes, not the {} its holder announced",
                            tensor.data.size(), first.total_bytes);
      }
      if (wrong.empty() && blake2b256_bytes(tensor.data) != state.tensor_hashes(index)) {
        wrong = fmt::format("{} served bytes that do not match the majority's hash",
                            printable(net::key_to_hex(holder_of(k).key()).substr(0, 8)));
      }
      if (!wrong.empty()) {
        why[index] = std::move(wrong);
        still.push_back(index);
        continue;
      }
      out[state.tensor_names(index)] = std::move(tensor);
      why.erase(index);
    }
    indices = std::move(still);
  }
  if (!indices.empty()) {
    const int index = indices.front();
    fail(
        "tensor {} of the parameters after step {} could not be fetched through the "
        "coordinator's relay from {} member(s) nobody can dial: {}",
        printable(state.tensor_names(index)), state.applied_steps(), holders.size(),
        why.contains(index) ? why[index] : "no time was left");
  }
}

}  // namespace agora::peer
