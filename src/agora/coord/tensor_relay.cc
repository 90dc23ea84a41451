#include "agora/coord/tensor_relay.h"

#include <fmt/format.h>

#include <algorithm>

namespace agora::coord {

TensorRelay::Key TensorRelay::key_of(const net::PublicKey& holder, const wire::GetTensor& get) {
  return {holder, get.applied_steps(), get.strategy_hash(), get.name(), get.offset(), get.length()};
}

std::vector<RelayOutgoing> TensorRelay::refuse(const std::string& route, const wire::GetTensor& get,
                                               std::string why) {
  ++counters_.refused;
  last_refusal_ = std::move(why);
  RelayOutgoing out;
  out.route = route;
  out.message.mutable_not_found()->set_what(net::relayed_chunk_what(get.name(), get.offset()));
  return {std::move(out)};
}

std::vector<RelayOutgoing> TensorRelay::request(const net::PublicKey& fetcher,
                                                const std::string& route,
                                                const wire::GetTensor& get, bool fetcher_current,
                                                bool holder_relayed, double now) {
  if (!fetcher_current) return refuse(route, get, "the asker is not a current member");
  if (!holder_relayed) {
    return refuse(route, get, "the holder is not a current member the relay serves");
  }
  if (get.length() == 0 || get.length() > limits_.max_chunk_bytes) {
    return refuse(route, get,
                  fmt::format("a chunk of {} bytes was asked; the relay carries 1 to {}",
                              get.length(), limits_.max_chunk_bytes));
  }
  if (get.name().empty() || get.name().size() > limits_.max_name) {
    return refuse(route, get,
                  fmt::format("a tensor name of {} bytes; 1 to {} allowed", get.name().size(),
                              limits_.max_name));
  }
  if (get.offset() > (uint64_t{1} << 40)) {
    return refuse(route, get, fmt::format("offset {} is past any tensor", get.offset()));
  }
  size_t& mine = waiting_by_fetcher_[fetcher];
  if (mine >= limits_.per_fetcher) {
    return refuse(route, get,
                  fmt::format("the asker has {} requests waiting already", limits_.per_fetcher));
  }
  const Key key = key_of(get.holder(), get);
  auto it = chunks_.find(key);
  if (it == chunks_.end()) {
    if (chunks_.size() >= limits_.max_waiting) {
      return refuse(route, get,
                    fmt::format("the relay has {} requests waiting", limits_.max_waiting));
    }
    it = chunks_.emplace(key, Chunk{}).first;
    it->second.request = get;
    it->second.asked_at = now;
    queue_.push_back(key);
  }
  for (const Waiter& w : it->second.waiters) {
    if (w.fetcher == fetcher && w.route == route) return {};  // asked again: one answer
  }
  it->second.waiters.push_back(Waiter{fetcher, route});
  ++mine;
  return {};
}

std::map<TensorRelay::Key, TensorRelay::Chunk>::iterator TensorRelay::drop(
    std::map<Key, Chunk>::iterator it, std::vector<RelayOutgoing>* not_found) {
  Chunk& chunk = it->second;
  for (const Waiter& w : chunk.waiters) {
    auto count = waiting_by_fetcher_.find(w.fetcher);
    if (count != waiting_by_fetcher_.end() && --count->second == 0) {
      waiting_by_fetcher_.erase(count);
    }
    if (not_found != nullptr) {
      RelayOutgoing out;
      out.route = w.route;
      out.message.mutable_not_found()->set_what(
          net::relayed_chunk_what(chunk.request.name(), chunk.request.offset()));
      not_found->push_back(std::move(out));
    }
  }
  if (chunk.forwarded) {
    auto count = forwarded_by_holder_.find(chunk.request.holder());
    if (count != forwarded_by_holder_.end() && --count->second == 0) {
      forwarded_by_holder_.erase(count);
    }
  }
  return chunks_.erase(it);
}

std::vector<RelayOutgoing> TensorRelay::answer(const net::PublicKey& holder,
                                               const wire::TensorData& data, double now) {
  (void)now;
  wire::GetTensor asked;
  asked.set_applied_steps(data.applied_steps());
  asked.set_strategy_hash(data.strategy_hash());
  asked.set_name(data.name());
  asked.set_offset(data.offset());
  // The length is not in the answer: the chunk asked of this holder at this offset.
  auto it = chunks_.lower_bound(key_of(holder, asked));
  const auto same = [&](const Key& k) {
    return std::get<0>(k) == holder && std::get<1>(k) == data.applied_steps() &&
           std::get<2>(k) == data.strategy_hash() && std::get<3>(k) == data.name() &&
           std::get<4>(k) == data.offset();
  };
  while (it != chunks_.end() && same(it->first) && !it->second.forwarded) ++it;
  std::vector<RelayOutgoing> out;
  if (it == chunks_.end() || !same(it->first)) {
    ++counters_.unsolicited;
    return out;
  }
  const uint64_t length = std::get<5>(it->first);
  const uint64_t size = data.data().size();
  // What a chunk of `length` at `offset` of a tensor of `total_bytes` must hold.
  const bool fits = data.missing() ? size == 0
                    : data.total_bytes() == 0
                        ? data.offset() == 0 && size == 0  // an empty tensor
                        : data.offset() < data.total_bytes() &&
                              size == std::min(length, data.total_bytes() - data.offset());
  if (!fits) {
    ++counters_.unsolicited;
    drop(it, &out);
    return out;
  }
  ++counters_.chunks;
  counters_.bytes_in += size;
  wire::Envelope reply;
  if (data.missing()) {
    reply.mutable_not_found()->set_what(net::relayed_chunk_what(data.name(), data.offset()));
  } else {
    *reply.mutable_tensor_data() = data;
    reply.mutable_tensor_data()->set_holder(holder);
  }
  for (const Waiter& w : it->second.waiters) {
    out.push_back(RelayOutgoing{w.route, {}, reply});
    if (!data.missing()) counters_.bytes_out += size;
  }
  drop(it, nullptr);
  return out;
}

std::vector<RelayOutgoing> TensorRelay::pump(double now) {
  std::vector<RelayOutgoing> out;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (now - it->second.asked_at > limits_.timeout_seconds) {
      ++counters_.expired;
      it = drop(it, &out);
    } else {
      ++it;
    }
  }
  if (tokens_ < 0) {
    tokens_ = limits_.burst_bytes;
  } else {
    tokens_ = std::min(limits_.burst_bytes,
                       tokens_ + std::max(0.0, now - refilled_at_) * limits_.bytes_per_second);
  }
  refilled_at_ = now;
  for (auto q = queue_.begin(); q != queue_.end();) {
    const auto it = chunks_.find(*q);
    if (it == chunks_.end() || it->second.forwarded) {
      q = queue_.erase(q);
      continue;
    }
    const wire::GetTensor& get = it->second.request;
    if (static_cast<double>(get.length()) > tokens_) break;  // in order: the oldest goes first
    size_t& busy = forwarded_by_holder_[get.holder()];
    if (busy >= limits_.per_holder) {
      ++q;  // this holder is busy; another holder's request may go
      continue;
    }
    ++busy;
    tokens_ -= static_cast<double>(get.length());
    it->second.forwarded = true;
    RelayOutgoing forward;
    forward.member = get.holder();
    *forward.message.mutable_get_tensor() = get;
    out.push_back(std::move(forward));
    q = queue_.erase(q);
  }
  return out;
}

}  // namespace agora::coord
