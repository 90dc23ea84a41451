#include "agora/optim/decoded_payloads.h"

#include <utility>

namespace agora {
namespace {

size_t cost_of(const Payload& payload) {
  size_t cost = sizeof(Payload);
  for (const TensorPayload& t : payload.tensors) {
    cost += sizeof(TensorPayload) + t.positions.size() * sizeof(uint32_t) +
            t.values.size() * sizeof(float) + t.quantized.size() + t.scales.size() * sizeof(float);
  }
  return cost;
}

}  // namespace

DecodedPayloads::DecodedPayloads(PayloadLayout layout, size_t max_bytes)
    : layout_(std::move(layout)), max_bytes_(max_bytes) {}

uint64_t DecodedPayloads::decode(std::string_view hash, std::string_view bytes, uint64_t step) {
  // Decoded outside the lock: the network's threads check payloads side by side.
  Payload payload = decode_payload(bytes, layout_);
  const uint64_t payload_step = payload.step;
  if (payload_step != step) return payload_step;
  const size_t cost = cost_of(payload);
  if (cost > max_bytes_) return payload_step;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (by_hash_.contains(std::string(hash))) return payload_step;  // fetched twice: kept once
  while (!entries_.empty() && bytes_ + cost > max_bytes_) erase(entries_.begin());
  entries_.push_back({std::string(hash), bytes.size(), std::move(payload), cost});
  by_hash_.emplace(entries_.back().hash, std::prev(entries_.end()));
  bytes_ += cost;
  return payload_step;
}

std::optional<Payload> DecodedPayloads::take(std::string_view hash, std::string_view bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.empty()) return std::nullopt;  // a trainer's simulated peers never fill one
  const auto it = by_hash_.find(std::string(hash));
  if (it == by_hash_.end() || it->second->size != bytes.size()) return std::nullopt;
  std::optional<Payload> out = std::move(it->second->payload);
  erase(it->second);
  return out;
}

void DecodedPayloads::forget_through(uint64_t step) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    const auto next = std::next(it);
    if (it->payload.step <= step) erase(it);
    it = next;
  }
}

size_t DecodedPayloads::size() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void DecodedPayloads::erase(Entries::iterator it) {
  by_hash_.erase(it->hash);
  bytes_ -= it->cost;
  entries_.erase(it);
}

}  // namespace agora
