#include "agora/coord/outbox.h"

#include "agora/net/envelope.h"

namespace agora::coord {

void Outbox::send(std::vector<Outgoing>& messages, const std::function<void()>& between) {
  std::map<const wire::Envelope*, std::shared_ptr<const std::string>> encoded;  // shared ones
  bool sent = false;
  for (Outgoing& out : messages) {
    if (sent) between();
    sent = true;
    const auto route = route_of_.find(out.to);
    if (route == route_of_.end()) {
      auto& waiting = undelivered_[out.to];
      waiting.push_back(out.merged());
      if (waiting.size() > kMaxUndelivered) waiting.pop_front();
      continue;
    }
    Queued& queue = queued_[out.to];
    if (out.body_case() == wire::Envelope::kRoundStart) {
      const uint64_t step = (out.shared ? *out.shared : out.message).round_start().step();
      if (queue.round_start_step == step && queue.in_flight->load() > 0) {
        ++round_starts_held_;
        continue;
      }
      queue.round_start_step = step;
    }
    std::shared_ptr<const std::string> bytes;
    if (!out.shared) {
      bytes = std::make_shared<const std::string>(net::encode_envelope(out.message));
    } else {
      auto& common = encoded[out.shared.get()];
      if (!common) common = std::make_shared<const std::string>(net::encode_envelope(*out.shared));
      bytes =
          out.message.ByteSizeLong() == 0
              ? common
              : std::make_shared<const std::string>(*common + net::encode_envelope(out.message));
    }
    // A full queue or a closed connection loses it as a plain send would: the member re-asks.
    server_.send_shared(route->second, std::move(bytes), queue.in_flight);
  }
}

void Outbox::connected(const net::PublicKey& key, const std::string& route) {
  route_of_[key] = route;
  if (auto pending = undelivered_.find(key); pending != undelivered_.end()) {
    // Saved by an earlier batch already: safe to send now.
    for (const auto& message : pending->second) server_.send(route, message);
    undelivered_.erase(pending);
  }
}

const std::string* Outbox::route(const net::PublicKey& key) const {
  const auto it = route_of_.find(key);
  return it == route_of_.end() ? nullptr : &it->second;
}

void Outbox::forget_others(const std::map<net::PublicKey, MemberRecord>& members) {
  std::erase_if(route_of_, [&](const auto& item) { return !members.contains(item.first); });
  std::erase_if(undelivered_, [&](const auto& item) { return !members.contains(item.first); });
  std::erase_if(queued_, [&](const auto& item) { return !members.contains(item.first); });
}

}  // namespace agora::coord
