#include "agora/coord/reachability.h"

#include <chrono>
#include <memory>

#include "agora/core/clock.h"
#include "agora/core/error.h"
#include "agora/serve/poll.h"

namespace agora::coord {

Prober::Prober(net::Context& context, const net::Identity& identity, double timeout_seconds)
    : context_(context), identity_(identity), timeout_seconds_(timeout_seconds) {
  thread_ = std::thread([this] { run(); });
}

Prober::~Prober() {
  stop_ = true;
  thread_.join();
}

void Prober::probe(const net::PublicKey& key, const std::string& endpoint) {
  MutexLock lock(mutex_);
  waiting_[key] = endpoint;
}

std::vector<ProbeResult> Prober::results() {
  MutexLock lock(mutex_);
  std::vector<ProbeResult> out;
  out.swap(done_);
  return out;
}

void Prober::run() {
  struct InFlight {
    ProbeResult result;
    std::unique_ptr<net::Client> client;
    double started = 0;
  };
  std::vector<InFlight> flying;
  // Replies are a NotFound or a Blob at most: small.
  const net::DecodeLimits limits{net::kMaxControlBytes, net::kMaxControlBytes};
  while (!stop_) {
    {
      MutexLock lock(mutex_);
      while (!waiting_.empty() && flying.size() < kMaxInFlight) {
        auto it = waiting_.begin();
        InFlight f;
        f.result.key = it->first;
        f.result.endpoint = it->second;
        waiting_.erase(it);
        f.started = unix_seconds();
        try {
          f.client = std::make_unique<net::Client>(context_, identity_, f.result.endpoint,
                                                   f.result.key, limits);
          wire::Envelope ask;
          ask.mutable_get_blob()->set_hash(std::string(32, '\0'));
          f.client->send(ask);
        } catch (const std::exception&) {
          f.client.reset();  // an endpoint ZeroMQ cannot even connect to: unreachable
        }
        flying.push_back(std::move(f));
      }
    }
    std::vector<zmq::pollitem_t> items;
    for (InFlight& f : flying) {
      if (f.client) items.push_back({f.client->socket().handle(), 0, ZMQ_POLLIN, 0});
    }
    if (items.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      serve::poll(items, std::chrono::milliseconds(50));
    }
    const double now = unix_seconds();
    std::vector<ProbeResult> finished;
    std::erase_if(flying, [&](InFlight& f) {
      bool answered = false;
      if (f.client) {
        try {
          answered = f.client->recv().has_value();
        } catch (const std::exception&) {
        }
      }
      if (!answered && now - f.started < timeout_seconds_ && f.client) return false;
      f.result.reachable = answered;
      f.result.seconds = now - f.started;
      finished.push_back(f.result);
      return true;
    });
    if (!finished.empty()) {
      MutexLock lock(mutex_);
      for (ProbeResult& r : finished) done_.push_back(std::move(r));
    }
  }
}

}  // namespace agora::coord
