// MemberClient: a member's side of serving, for the processes that work for a server (the
// asynchronous worker, the RL rollout worker): say hello until answered, wait for one kind of
// answer while handing everything else (receipts) to the worker, and say hello again when the
// server refused a message because it lost this member.
//
// The server's refusal (serve/members.h) with may_rejoin means "I do not know you": the server
// forgot this member after its silence, or restarted. The client sends its hello again, at most
// once a second, and carries on waiting; the worker's next request goes to a server that knows
// it again. A refusal without may_rejoin ends the worker (Error with the server's reason).
//
// A wait ends early, with nothing, when a signal arrives (serve/poll.h) or `stop` is set, so a
// worker's Ctrl-C is never stuck in a wait.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "agora/net/curve_socket.h"

namespace agora::serve {

class MemberClient {
 public:
  using Match = std::function<bool(const wire::Envelope&)>;
  // `client` is the connection to the server; `hello` the role's hello message. `on_other` gets
  // every message no wait asked for (receipts); `on_rejoin` is told the refusal's reason each
  // time the hello is sent again. `stop` may be null.
  MemberClient(net::Client& client, wire::Envelope hello,
               std::function<void(const wire::Envelope&)> on_other,
               std::function<void(const std::string& reason)> on_rejoin,
               const std::atomic<bool>* stop = nullptr);

  // Sends the hello every two seconds until an answer `is_answer` arrives, for at most
  // `seconds`. Nothing when none came (the caller says what to check: the address, the key).
  std::optional<wire::Envelope> join(const Match& is_answer, double seconds);
  // The next message `want` matches, within `seconds`.
  std::optional<wire::Envelope> wait_for(const Match& want, double seconds);
  void send(const wire::Envelope& message) { client_.send(message); }

 private:
  void on_refused(const wire::Refused& refused);

  net::Client& client_;
  wire::Envelope hello_;
  std::function<void(const wire::Envelope&)> on_other_;
  std::function<void(const std::string&)> on_rejoin_;
  const std::atomic<bool>* stop_;
  double last_hello_ = -10;
};

}  // namespace agora::serve
