#include "agora/net/curve_socket.h"

#include <zmq_addon.hpp>

#include <algorithm>

#include "agora/core/error.h"

namespace agora::net {

namespace {

// What ZeroMQ may buffer of one frame before it drops the connection: the largest message the
// limits allow, never above what protobuf parses, and a little for framing.
int64_t largest_frame(const DecodeLimits& limits) {
  return static_cast<int64_t>(
             std::min(std::max(limits.max_control, limits.max_data), kMaxEnvelopeBytes)) +
         1024;
}

// ZeroMQ's ZAP endpoint: a server socket with a ZAP domain asks whoever is bound here.
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kZapDomain = "agora";

std::string to_string(const zmq::message_t& m) {
  return std::string(m.to_string_view());
}

}  // namespace

Context::Context(Admission admission) : admission_(std::move(admission)) {
  // Bind the ZAP socket before any server exists, so no handshake can slip past it.
  auto zap = std::make_shared<zmq::socket_t>(context_, zmq::socket_type::rep);
  zap->bind(kZapEndpoint);
  zap_thread_ = std::thread([this, zap] {
    zap->set(zmq::sockopt::rcvtimeo, 100);
    while (!stop_.load()) {
      std::vector<zmq::message_t> request;
      try {
        if (!zmq::recv_multipart(*zap, std::back_inserter(request))) continue;
      } catch (const zmq::error_t&) {
        break;  // the context is terminating
      }
      // version, request id, domain, address, identity, mechanism, credentials...
      std::string status = "400", text = "malformed ZAP request", user;
      if (request.size() >= 7 && to_string(request[0]) == "1.0" &&
          to_string(request[5]) == "CURVE") {
        const std::string key = to_string(request[6]);
        bool allowed;
        {
          std::lock_guard lock(mutex_);
          allowed = admission_.open || admission_.curve_keys.count(key) > 0;
        }
        if (allowed) {
          status = "200", text = "OK", user = key_to_hex(key);
        } else {
          text = "key not on the run's allowlist";
          refused_.fetch_add(1);
        }
      }
      const std::string id = request.size() > 1 ? to_string(request[1]) : std::string();
      std::vector<zmq::const_buffer> reply = {zmq::str_buffer("1.0"), zmq::buffer(id),
                                              zmq::buffer(status),    zmq::buffer(text),
                                              zmq::buffer(user),      zmq::str_buffer("")};
      try {
        zmq::send_multipart(*zap, reply);
      } catch (const zmq::error_t&) {
        break;
      }
    }
    zap->close();
  });
}

Context::~Context() {
  stop_.store(true);
  zap_thread_.join();
  context_.shutdown();
  context_.close();
}

void Context::set_admission(Admission admission) {
  std::lock_guard lock(mutex_);
  admission_ = std::move(admission);
}

Server::Server(Context& context, const Identity& identity, const std::string& endpoint,
               const DecodeLimits& limits, int reply_queue)
    : socket_(context.zmq(), zmq::socket_type::router), limits_(limits) {
  if (reply_queue > 0) {
    socket_.set(zmq::sockopt::sndhwm, reply_queue);
    socket_.set(zmq::sockopt::router_mandatory, 1);
  }
  socket_.set(zmq::sockopt::curve_server, 1);
  socket_.set(zmq::sockopt::curve_secretkey, zmq::buffer(identity.curve_secret()));
  socket_.set(zmq::sockopt::zap_domain, kZapDomain);
  socket_.set(zmq::sockopt::linger, 0);
  // A reconnecting client takes over its routing id; frames above the limit drop the connection.
  socket_.set(zmq::sockopt::router_handover, 1);
  socket_.set(zmq::sockopt::maxmsgsize, largest_frame(limits));
  try {
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    fail(
        "cannot listen on {}: {} (is another process using the port? allowed: "
        "tcp://HOST:PORT)",
        endpoint, e.what());
  }
}

std::string Server::bound_endpoint() const {
  return socket_.get(zmq::sockopt::last_endpoint);
}

std::optional<Incoming> Server::recv() {
  while (true) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(socket_, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      return std::nullopt;
    }
    for (const auto& part : parts) count_received(part.size());
    if (parts.size() != 2) {
      count_drop("frames", fmt::format("message with {} frames (expected one)", parts.size() - 1));
      continue;
    }
    const char* user = parts[1].gets("User-Id");
    std::string curve_key;
    try {
      curve_key = user ? key_from_hex(user, "ZAP user id") : std::string();
    } catch (const Error&) {
      curve_key.clear();
    }
    if (curve_key.empty()) {
      count_drop("unauthenticated", "message without an authenticated key");
      continue;
    }
    Decoded decoded = decode_envelope(parts[1].to_string_view(), limits_);
    if (auto* failure = std::get_if<DecodeFailure>(&decoded)) {
      count_drop(to_token(failure->code), std::move(failure->reason));
      continue;
    }
    return Incoming{to_string(parts[0]), std::move(curve_key),
                    std::move(std::get<wire::Envelope>(decoded))};
  }
}

void Server::send(const std::string& route, const wire::Envelope& message) {
  send_encoded(route, encode_envelope(message));
}

void Server::send_encoded(const std::string& route, const std::string& bytes) {
  count_sent(bytes.size());
  std::vector<zmq::const_buffer> parts = {zmq::buffer(route), zmq::buffer(bytes)};
  try {
    zmq::send_multipart(socket_, parts, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The connection is gone or its queue is full: the receiver recovers (it re-asks).
  }
}

namespace {

struct SharedReply {
  std::shared_ptr<const std::string> bytes;
  std::shared_ptr<std::atomic<int64_t>> in_flight;
};

// Called by ZeroMQ (on its I/O thread) once the frame is written or discarded.
void release_shared(void* /*data*/, void* hint) {
  auto* reply = static_cast<SharedReply*>(hint);
  reply->in_flight->fetch_sub(static_cast<int64_t>(reply->bytes->size()));
  delete reply;
}

}  // namespace

Server::SendResult Server::send_shared(const std::string& route,
                                       std::shared_ptr<const std::string> bytes,
                                       std::shared_ptr<std::atomic<int64_t>> in_flight) {
  const size_t size = bytes->size();
  try {
    zmq::message_t head(route.data(), route.size());
    if (!socket_.send(head, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      return SendResult::kQueueFull;
    }
  } catch (const zmq::error_t&) {
    return SendResult::kGone;  // EHOSTUNREACH: the connection closed
  }
  in_flight->fetch_add(static_cast<int64_t>(size));
  auto* hint = new SharedReply{std::move(bytes), std::move(in_flight)};
  zmq::message_t body(const_cast<char*>(hint->bytes->data()), size, release_shared, hint);
  // With the head queued the body cannot block: a multipart message is accepted whole.
  socket_.send(body, zmq::send_flags::dontwait);
  count_sent(size);
  return SendResult::kQueued;
}

Client::Client(Context& context, const Identity& identity, const std::string& endpoint,
               const PublicKey& server_key, const DecodeLimits& limits, int receive_queue)
    : socket_(context.zmq(), zmq::socket_type::dealer), endpoint_(endpoint), limits_(limits) {
  if (receive_queue > 0) socket_.set(zmq::sockopt::rcvhwm, receive_queue);
  socket_.set(zmq::sockopt::curve_serverkey, zmq::buffer(curve_public_of(server_key)));
  socket_.set(zmq::sockopt::curve_publickey, zmq::buffer(identity.curve_public()));
  socket_.set(zmq::sockopt::curve_secretkey, zmq::buffer(identity.curve_secret()));
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, largest_frame(limits));
  socket_.set(zmq::sockopt::reconnect_ivl, 200);
  socket_.set(zmq::sockopt::reconnect_ivl_max, 2000);
  try {
    socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    fail("cannot connect to {}: {} (allowed: tcp://HOST:PORT)", endpoint, e.what());
  }
}

std::optional<wire::Envelope> Client::recv() {
  while (true) {
    zmq::message_t message;
    if (!socket_.recv(message, zmq::recv_flags::dontwait)) return std::nullopt;
    count_received(message.size());
    Decoded decoded = decode_envelope(message.to_string_view(), limits_);
    if (auto* failure = std::get_if<DecodeFailure>(&decoded)) {
      count_drop(to_token(failure->code), std::move(failure->reason));
      continue;
    }
    return std::move(std::get<wire::Envelope>(decoded));
  }
}

void Client::send(const wire::Envelope& message) {
  const std::string bytes = encode_envelope(message);
  count_sent(bytes.size());
  try {
    socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // Queue full (the server is unreachable for long): the protocol re-sends what matters.
  }
}

}  // namespace agora::net
