#include "agora/peer/peer_server.h"

#include <algorithm>

#include "agora/core/error.h"
#include "agora/serve/members.h"
#include "agora/serve/poll.h"

namespace agora::peer {

namespace {

net::DecodeLimits request_limits(const PeerServerLimits& limits) {
  // Blob and TensorData are replies: no request of theirs is valid, whatever its size.
  return net::DecodeLimits{limits.max_request_bytes, 0};
}

}  // namespace

PeerServer::PeerServer(net::Context& context, const net::Identity& identity,
                       const std::string& listen, PeerServerLimits limits, SnapshotLookup snapshots,
                       ManifestLookup manifests, Count count)
    : limits_(limits),
      snapshots_(std::move(snapshots)),
      manifests_(std::move(manifests)),
      count_(std::move(count)),
      server_(context, identity, listen, request_limits(limits), limits.replies_per_connection),
      member_rates_({limits.member_requests_per_second, limits.member_burst}, {}),
      connection_rates_({limits.connection_requests_per_second, limits.connection_burst}, {},
                        limits.max_connections_tracked) {}

void PeerServer::end_current(double now) {
  for (auto it = members_.begin(); it != members_.end();) {
    Admission& a = it->second;
    if (a.current) {
      a.current = false;
      a.until = now + limits_.grace_seconds;
    }
    it = a.until < now ? members_.erase(it) : std::next(it);
  }
  member_rates_.forget_if([&](const std::string& key) { return !members_.contains(key); });
}

void PeerServer::admit_key(const std::string& ed25519_key, double now) {
  std::string curve;
  try {
    curve = net::curve_public_of(ed25519_key);
  } catch (const Error&) {
    return;  // not a key anyone can hold a connection with
  }
  Admission& a = members_[curve];
  a.current = true;
  a.until = now;
}

bool PeerServer::admitted(const std::string& curve_key, double now) const {
  const auto it = members_.find(curve_key);
  return it != members_.end() && (it->second.current || it->second.until >= now);
}

std::array<uint64_t, kRefusals> PeerServer::refusals() const {
  std::array<uint64_t, kRefusals> out{};
  for (size_t i = 0; i < kRefusals; ++i) out[i] = refused_[i].load();
  return out;
}

void PeerServer::refuse(Refusal why, const std::string& route, const std::string& what,
                        double now) {
  refused_[static_cast<size_t>(why)].fetch_add(1);
  // A stranger is told (a joiner retries once it is listed); answers are rate-limited in all so
  // that refusing costs less than asking. Rate and queue refusals get no answer: the asker's
  // timeout moves it to another source.
  if (why != Refusal::kNotMember ||
      !refusal_replies_.take(limits_.refusal_replies_per_second, limits_.refusal_replies_per_second,
                             now)) {
    return;
  }
  reply(route,
        std::make_shared<const std::string>(
            net::encode_envelope(serve::refusal(what, /*may_rejoin=*/true))),
        Traffic::kControl);
}

void PeerServer::reply(const std::string& route, std::shared_ptr<const std::string> bytes,
                       Traffic kind) {
  const uint64_t size = bytes->size();
  if (in_flight_->load() + static_cast<int64_t>(size) > limits_.max_bytes_in_flight) {
    refused_[static_cast<size_t>(Refusal::kBytesInFlight)].fetch_add(1);
    return;
  }
  switch (server_.send_shared(route, std::move(bytes), in_flight_)) {
    case net::Server::SendResult::kQueued:
      count_(kind, true, size);
      break;
    case net::Server::SendResult::kQueueFull:
      refused_[static_cast<size_t>(Refusal::kReplyQueue)].fetch_add(1);
      break;
    case net::Server::SendResult::kGone:
      break;  // the asker left; nothing to count
  }
}

std::shared_ptr<const std::string> PeerServer::tensor_reply(const wire::GetTensor& get) {
  const std::shared_ptr<const Snapshot> snapshot = snapshots_(get);
  if (!snapshot) return nullptr;
  const auto t = snapshot->find(get.name());
  if (t == snapshot->end()) return nullptr;
  const auto key = std::make_tuple(get.applied_steps(), get.strategy_hash(), get.name());
  if (const auto it = cache_.find(key); it != cache_.end()) {
    if (it->second.snapshot.lock() == snapshot) return it->second.bytes;
    cache_bytes_ -= static_cast<int64_t>(it->second.bytes->size());
    cache_.erase(it);
  }
  wire::Envelope e;
  auto* data = e.mutable_tensor_data();
  data->set_applied_steps(get.applied_steps());
  data->set_strategy_hash(get.strategy_hash());
  data->set_name(t->first);
  data->set_dtype(t->second.dtype);
  for (int64_t d : t->second.shape) data->add_shape(d);
  data->set_data(t->second.data);
  auto bytes = std::make_shared<const std::string>(net::encode_envelope(e));
  const auto over = [&] {
    return cache_bytes_ + static_cast<int64_t>(bytes->size()) > limits_.reply_cache_bytes;
  };
  // Past the cap, entries of snapshots no longer published go first, then the oldest steps'.
  for (bool stale_only : {true, false}) {
    for (auto it = cache_.begin(); it != cache_.end() && over();) {
      if (stale_only && !it->second.snapshot.expired()) {
        ++it;
        continue;
      }
      cache_bytes_ -= static_cast<int64_t>(it->second.bytes->size());
      it = cache_.erase(it);
    }
  }
  if (!over()) {
    cache_[key] = Cached{snapshot, bytes};
    cache_bytes_ += static_cast<int64_t>(bytes->size());
  }
  return bytes;
}

void PeerServer::serve_data(DataLookup lookup) {
  std::lock_guard lock(data_mutex_);
  data_ = std::make_shared<const DataLookup>(std::move(lookup));
}

std::optional<std::string> PeerServer::data_chunk(const std::string& hash, double now) {
  data_busy_ = false;
  std::shared_ptr<const DataLookup> lookup;
  {
    std::lock_guard lock(data_mutex_);
    lookup = data_;
  }
  if (!lookup) return std::nullopt;
  data_tokens_ =
      std::min(limits_.data_burst_bytes,
               data_tokens_ + std::max(0.0, now - data_last_) * limits_.data_bytes_per_second);
  data_last_ = std::max(data_last_, now);
  // Checked before the read: a chunk is at most 1 MiB, and the bucket must hold a whole one.
  if (data_tokens_ < 1 << 20) {
    data_busy_ = true;
    return std::nullopt;
  }
  auto chunk = (*lookup)(hash);
  if (chunk) data_tokens_ -= static_cast<double>(chunk->size());
  return chunk;
}

size_t PeerServer::serve(const net::BlobStore& blobs, double now) {
  return serve::drain(server_, {limits_.requests_per_poll, limits_.seconds_per_poll},
                      [&](const net::Incoming& in) { answer(in, blobs, now); });
}

void PeerServer::answer(const net::Incoming& in, const net::BlobStore& blobs, double now) {
  const wire::Envelope& m = in.message;
  const Traffic kind = m.has_get_blob() ? Traffic::kPayload : Traffic::kState;
  count_(m.has_get_blob() || m.has_get_tensor() ? kind : Traffic::kControl, false,
         m.ByteSizeLong());
  if (!admitted(in.curve_key, now)) {
    refuse(Refusal::kNotMember, in.route, kNotAdmitted, now);
    return;
  }
  if (!member_rates_.take(in.curve_key, /*member=*/true, now)) {
    refuse(Refusal::kMemberRate, in.route, {}, now);
    return;
  }
  // Routes of closed connections pile up; the gate forgets them (at most
  // max_connections_tracked are kept).
  if (!connection_rates_.take(in.route, /*member=*/true, now)) {
    refuse(Refusal::kConnectionRate, in.route, {}, now);
    return;
  }
  if (m.has_get_blob() && m.get_blob().hash().size() == 32) {
    wire::Envelope e;
    const std::string& hash = m.get_blob().hash();
    Traffic traffic = Traffic::kPayload;
    if (auto bytes = blobs.get(hash)) {
      e.mutable_blob()->set_hash(hash);
      e.mutable_blob()->set_data(std::move(*bytes));
    } else if (auto manifest = manifests_(hash)) {
      e.mutable_blob()->set_hash(hash);
      e.mutable_blob()->set_data(*manifest);
      traffic = Traffic::kState;
    } else if (auto chunk = data_chunk(hash, now)) {
      e.mutable_blob()->set_hash(hash);
      e.mutable_blob()->set_data(std::move(*chunk));
    } else {
      e.mutable_not_found()->set_what(data_busy_ ? hash + " busy: this peer's data rate is spent"
                                                 : hash);
    }
    reply(in.route, std::make_shared<const std::string>(net::encode_envelope(e)),
          e.has_blob() ? traffic : Traffic::kControl);
  } else if (m.has_get_tensor() && m.get_tensor().name().size() <= limits_.max_tensor_name) {
    if (auto bytes = tensor_reply(m.get_tensor())) {
      reply(in.route, std::move(bytes), Traffic::kState);
    } else {
      wire::Envelope e;
      e.mutable_not_found()->set_what(m.get_tensor().name());
      reply(in.route, std::make_shared<const std::string>(net::encode_envelope(e)),
            Traffic::kControl);
    }
  } else {
    refuse(Refusal::kBadRequest, in.route, {}, now);
  }
}

}  // namespace agora::peer
