#include "agora/serve/poll.h"

#include <cerrno>

namespace agora::serve {

int poll(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items.data(), items.size(), timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;  // a signal: the caller's loop checks its stop flag
    throw;
  }
}

bool wait_readable(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  std::vector<zmq::pollitem_t> items = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
  return poll(items, timeout) > 0 && (items[0].revents & ZMQ_POLLIN) != 0;
}

size_t drain(net::Server& server, const BatchLimits& limits,
             const std::function<void(const net::Incoming&)>& handle) {
  const auto started = std::chrono::steady_clock::now();
  const auto budget = std::chrono::duration<double>(limits.max_seconds);
  size_t handled = 0;
  while (handled < limits.max_messages && std::chrono::steady_clock::now() - started < budget) {
    std::optional<net::Incoming> in = server.recv();
    if (!in) break;
    handle(*in);
    ++handled;
  }
  return handled;
}

}  // namespace agora::serve
