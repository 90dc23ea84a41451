// Waiting on sockets and draining a server: the loop every agora process that serves members
// runs, written once.
//
// zmq::poll throws zmq::error_t(EINTR) when a signal arrives while it waits (cppzmq turns every
// failed zmq_poll into an exception). A server whose Ctrl-C handler only sets a stop flag would
// then die with "Interrupted system call" instead of finishing its run: no final checkpoint, no
// validation, no summary. wait_readable() and poll() take the signal as an early wake-up, so the
// caller's loop gets to check its stop flag.
//
// drain() hands what is waiting on a server to the role, in a bounded batch: at most
// max_messages or max_seconds of handling, so a flood of messages cannot keep the loop from its
// tick (deadlines, sweeps, saves) however fast they arrive.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>
#include <zmq.hpp>

#include "agora/net/curve_socket.h"

namespace agora::serve {

// Waits up to `timeout` for a message on `socket`. False when the time passed or a signal ended
// the wait (EINTR); other ZeroMQ errors throw.
bool wait_readable(zmq::socket_t& socket, std::chrono::milliseconds timeout);

// zmq::poll over `items`, up to `timeout`: the number of items ready, 0 after a signal.
int poll(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout);

struct BatchLimits {
  size_t max_messages = 256;
  double max_seconds = 0.05;
};

// Receives what is waiting on `server`, within `limits`, and hands each message to `handle`.
// Malformed messages are counted by the server (net::Server::recv) and skipped. Returns how many
// messages were handed over.
size_t drain(net::Server& server, const BatchLimits& limits,
             const std::function<void(const net::Incoming&)>& handle);

}  // namespace agora::serve
