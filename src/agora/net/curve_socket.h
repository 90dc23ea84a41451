// CURVE-encrypted ZeroMQ sockets with an allowlist: the only way agora processes talk.
//
// Every connection is encrypted and mutually authenticated by ZeroMQ's CURVE handshake (keys from
// net/identity.h). A server also runs ZAP (ZeroMQ's authentication protocol): during the
// handshake a client's key is checked against the run's allowlist (or admitted, for an open run)
// before any message of it is delivered; a refused client never reaches application code. Every
// delivered message carries the client's authenticated CURVE key, so a server always knows who
// sent what without trusting anything inside the message.
//
//   Server: a ROUTER socket bound to an endpoint. recv() gives (route, sender key, message);
//           send(route, message) answers that connection. ZMQ_MAXMSGSIZE drops connections that
//           send frames above the limit before they are buffered.
//   Client: a DEALER socket connected to one server whose key it knows; ZeroMQ reconnects by
//           itself after the server restarts, and queues what is sent meanwhile.
//
// Each counts the bytes it sends and receives and the messages it drops, by reason, for
// /metrics. Neither class is thread-safe: one thread owns each socket (ZeroMQ's rule), and
// reads its counters. A Context is
// shared; it owns the ZAP handler thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "agora/net/envelope.h"
#include "agora/net/identity.h"

namespace agora::net {

// Who may connect to this process's servers.
struct Admission {
  bool open = true;                  // anyone with a valid CURVE key
  std::set<std::string> curve_keys;  // otherwise: these curve25519 public keys only
};

// A ZeroMQ context plus the ZAP handler every server socket of the process uses.
class Context {
 public:
  explicit Context(Admission admission = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  zmq::context_t& zmq() { return context_; }
  // Replaces who is admitted from now on (existing connections stay).
  void set_admission(Admission admission);
  // Handshakes refused by the allowlist so far.
  uint64_t refused() const { return refused_.load(); }

 private:
  void serve_zap();

  zmq::context_t context_;
  std::mutex mutex_;
  Admission admission_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread zap_thread_;
};

struct Incoming {
  std::string route;      // ZeroMQ routing id of the connection (server side)
  std::string curve_key;  // the sender's authenticated curve25519 key (server side)
  wire::Envelope message;
};

// What a Server or Client counts for /metrics, read by the thread that owns the socket.
class SocketCounters {
 public:
  uint64_t dropped() const { return dropped_; }
  const std::string& last_drop_reason() const { return last_drop_; }
  // Drops by short reason token (frames, unauthenticated, or to_token(DecodeError)'s).
  const std::map<std::string, uint64_t>& drops_by_reason() const { return drops_by_reason_; }
  // Bytes of the frames received (valid or not) and of the messages handed to ZeroMQ.
  uint64_t bytes_received() const { return bytes_received_; }
  uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  void count_received(size_t bytes) { bytes_received_ += bytes; }
  void count_sent(size_t bytes) { bytes_sent_ += bytes; }
  void count_drop(std::string_view token, std::string reason) {
    ++dropped_;
    ++drops_by_reason_[std::string(token)];
    last_drop_ = std::move(reason);
  }

 private:
  uint64_t dropped_ = 0;
  std::string last_drop_;
  std::map<std::string, uint64_t> drops_by_reason_;
  uint64_t bytes_received_ = 0, bytes_sent_ = 0;
};

class Server : public SocketCounters {
 public:
  // Binds `endpoint` ("tcp://0.0.0.0:7400"; port 0 is not supported by ZeroMQ's tcp: use "*"
  // ports via bound_endpoint()). Throws Error naming the endpoint when binding fails.
  // `reply_queue` > 0 bounds what waits to be written: at most that many replies per
  // connection, beyond which send_shared() refuses (instead of ZeroMQ dropping silently).
  // It must be set before binding: connections take the socket's options of that moment.
  Server(Context& context, const Identity& identity, const std::string& endpoint,
         const DecodeLimits& limits, int reply_queue = 0);
  // The endpoint actually bound (resolves "tcp://127.0.0.1:*").
  std::string bound_endpoint() const;
  zmq::socket_t& socket() { return socket_; }

  // The next valid message if one is waiting; malformed ones are counted in dropped() and
  // skipped (last_drop_reason() holds the latest reason).
  std::optional<Incoming> recv();
  void send(const std::string& route, const wire::Envelope& message);
  // `bytes` already encoded (an Envelope, or several whose concatenation parses as their merge).
  void send_encoded(const std::string& route, const std::string& bytes);

  // Why send_shared() did not queue a reply.
  enum class SendResult { kQueued, kQueueFull, kGone };
  // Queues `bytes` (an encoded Envelope) without copying them: every reply of the same bytes
  // shares one buffer. `in_flight` grows by their size until ZeroMQ has written them.
  SendResult send_shared(const std::string& route, std::shared_ptr<const std::string> bytes,
                         std::shared_ptr<std::atomic<int64_t>> in_flight);

 private:
  zmq::socket_t socket_;
  DecodeLimits limits_;
};

class Client : public SocketCounters {
 public:
  // Connects to `endpoint`, expecting the server to hold ed25519 key `server_key` (the CURVE
  // handshake fails against any other key, so nobody else can answer as that server).
  // `receive_queue` > 0: at most that many messages received and not yet read; beyond them
  // ZeroMQ stops reading the connection (TCP pushes back) instead of buffering what the server
  // streams. 0 = ZeroMQ's default (1000).
  Client(Context& context, const Identity& identity, const std::string& endpoint,
         const PublicKey& server_key, const DecodeLimits& limits, int receive_queue = 0);
  zmq::socket_t& socket() { return socket_; }
  const std::string& endpoint() const { return endpoint_; }

  std::optional<wire::Envelope> recv();  // non-blocking; malformed messages are dropped
  void send(const wire::Envelope& message);

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
  DecodeLimits limits_;
};

}  // namespace agora::net
