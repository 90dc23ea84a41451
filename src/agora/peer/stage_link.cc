#include "agora/peer/stage_link.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <zmq.hpp>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/serve/poll.h"

namespace agora::peer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// `stage`: the sender's, or in an error the stage that failed first.
wire::Envelope envelope(std::string bytes, const std::string& error, int64_t stage) {
  wire::Envelope e;
  wire::StageData* data = e.mutable_stage_data();
  data->set_boundary(std::move(bytes));
  data->set_error(error);
  data->set_stage(static_cast<uint32_t>(stage));
  return e;
}

std::string steps_text(const std::vector<uint64_t>& steps) {
  std::string out;
  for (const uint64_t s : steps) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out;
}

}  // namespace

StageLink::StageLink(const net::Identity& identity, const StageLinkOptions& options)
    : stage_(options.stage),
      stages_(options.stages),
      timeout_(options.timeout_seconds),
      start_timeout_(options.start_timeout_seconds),
      max_waiting_(options.max_waiting) {
  net::DecodeLimits limits;
  if (options.max_boundary_bytes > 0) {
    limits.max_data = std::min(limits.max_data, options.max_boundary_bytes);
  }
  if (stage_ > 0) server_.emplace(context_, identity, options.listen, limits);
  if (options.prev_key) {
    prev_curve_ = net::curve_public_of(*options.prev_key);
    admit_only_previous();
  }
  if (stage_ < stages_ - 1) {
    client_.emplace(context_, identity, options.next, options.next_key, limits);
  }
  last_heard_prev_ = last_heard_next_ = Clock::now();
}

// From now on the handshake itself refuses every other key, so an outsider's frames (up to the
// frame limit) are never received, decrypted and parsed only to be dropped (issue 38, finding 8).
void StageLink::admit_only_previous() {
  net::Admission only;
  only.open = false;
  only.curve_keys = {prev_curve_};
  context_.set_admission(std::move(only));
}

std::string StageLink::endpoint() const {
  return server_ ? server_->bound_endpoint() : "";
}

uint64_t StageLink::start(const std::string& fingerprint, std::vector<uint64_t> steps) {
  steps.push_back(0);
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  if (steps.size() > kMaxHelloSteps)
    steps.erase(steps.begin() + 1, steps.end() - kMaxHelloSteps + 1);
  // Forward: what every stage up to this one holds.
  if (stage_ > 0) {
    wait_for(BoundaryDirection::kForward, "hello", start_timeout_,
             [&] { return hello_.has_value(); });
    if (hello_->fingerprint() != fingerprint) {
      blamed_ = stage_ - 1;
      fail(
          "stage {}: stage {} runs another configuration (fingerprint {}, this stage's {}): "
          "every stage must run the same model, data.seq_len, seed, [train] steps and batch, "
          "[optimizer], [schedule] and [pipeline]",
          stage_, stage_ - 1, short_hex(hello_->fingerprint()), short_hex(fingerprint));
    }
    std::vector<uint64_t> common = {0};  // the seeded start, whatever the hello offered
    for (const uint64_t s : hello_->steps()) {
      if (std::binary_search(steps.begin(), steps.end(), s)) common.push_back(s);
    }
    std::sort(common.begin(), common.end());
    common.erase(std::unique(common.begin(), common.end()), common.end());
    steps = common;
  }
  if (stage_ < stages_ - 1) {
    wire::Envelope e = envelope("", "", stage_);
    wire::StageHello* hello = e.mutable_stage_data()->mutable_hello();
    hello->set_fingerprint(fingerprint);
    for (const uint64_t s : steps) hello->add_steps(s);
    client_->send(e);
  }
  // Backward: the newest step all hold, chosen by the last stage.
  uint64_t chosen = steps.empty() ? 0 : steps.back();
  if (stage_ < stages_ - 1) {
    wait_for(BoundaryDirection::kBackward, "start", start_timeout_,
             [&] { return start_.has_value(); });
    chosen = start_->start_step();
    if (!std::binary_search(steps.begin(), steps.end(), chosen)) {
      blamed_ = stage_ + 1;
      fail(
          "stage {}: stage {} starts the run at step {}, which this stage did not offer "
          "(offered: {})",
          stage_, stage_ + 1, chosen, steps_text(steps));
    }
  }
  if (stage_ > 0) {
    wire::Envelope e = envelope("", "", stage_);
    wire::StageHello* start = e.mutable_stage_data()->mutable_hello();
    start->set_start(true);
    start->set_start_step(chosen);
    server_->send(prev_route_, e);
  }
  // Silence counts from here: the neighbours could send nothing before the start.
  last_heard_prev_ = last_heard_next_ = Clock::now();
  return chosen;
}

void StageLink::send_forward(std::string bytes) {
  client_->send(envelope(std::move(bytes), "", stage_));
}

void StageLink::send_backward(std::string bytes) {
  if (prev_route_.empty()) fail("stage {}: no previous stage to answer", stage_);
  server_->send(prev_route_, envelope(std::move(bytes), "", stage_));
}

template <typename Ready>
void StageLink::wait_for(BoundaryDirection direction, const char* what, double timeout,
                         Ready ready) {
  const bool forward = direction == BoundaryDirection::kForward;
  while (!ready()) {
    pump(std::chrono::milliseconds(50));
    if (ready()) return;
    const double silent = seconds_since(forward ? last_heard_prev_ : last_heard_next_);
    if (silent > timeout) {
      blamed_ = forward ? stage_ - 1 : stage_ + 1;
      fail(
          "stage {}: stage {} sent nothing for {:.0f} s while this stage waited for its {} "
          "(it stopped, or the link is down; pipeline stages cannot be replaced during a run "
          "yet)",
          stage_, blamed_, silent, what);
    }
  }
}

std::string StageLink::await(BoundaryDirection direction, int64_t step, int64_t piece) {
  const auto key = std::make_tuple(static_cast<int>(direction), step, piece);
  const std::string what =
      fmt::format("{} of step {}",
                  direction == BoundaryDirection::kForward ? "activations" : "gradients", step);
  wait_for(direction, what.c_str(), timeout_, [&] { return waiting_.contains(key); });
  const auto found = waiting_.find(key);
  std::string bytes = std::move(found->second);
  waiting_.erase(found);
  return bytes;
}

void StageLink::tell_failure(const std::string& what) {
  const int64_t first = blamed_ >= 0 ? blamed_ : stage_;
  try {
    if (client_) client_->send(envelope("", what, first));
    if (server_ && !prev_route_.empty()) server_->send(prev_route_, envelope("", what, first));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let ZeroMQ write them
  } catch (const std::exception&) {
  }
}

void StageLink::drain() {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

uint64_t StageLink::bytes_sent() const {
  return (server_ ? server_->bytes_sent() : 0) + (client_ ? client_->bytes_sent() : 0);
}

uint64_t StageLink::bytes_received() const {
  return (server_ ? server_->bytes_received() : 0) + (client_ ? client_->bytes_received() : 0);
}

void StageLink::pump(std::chrono::milliseconds wait) {
  std::vector<zmq::pollitem_t> items;
  if (server_) items.push_back({server_->socket().handle(), 0, ZMQ_POLLIN, 0});
  if (client_) items.push_back({client_->socket().handle(), 0, ZMQ_POLLIN, 0});
  serve::poll(items, wait);
  if (server_) {
    while (auto in = server_->recv()) {
      if (prev_curve_.empty()) {  // trust on first use
        prev_curve_ = in->curve_key;
        admit_only_previous();
      }
      if (in->curve_key != prev_curve_) {
        ++ignored_;
        continue;
      }
      prev_route_ = in->route;
      take(in->message, BoundaryDirection::kForward);
    }
  }
  if (client_) {
    while (auto in = client_->recv()) take(*in, BoundaryDirection::kBackward);
  }
}

void StageLink::take_hello(const wire::StageHello& hello, BoundaryDirection expected) {
  const bool forward = expected == BoundaryDirection::kForward;
  const int64_t from = forward ? stage_ - 1 : stage_ + 1;
  std::optional<wire::StageHello>& slot = forward ? hello_ : start_;
  blamed_ = from;
  if (slot) fail("stage {}: stage {} sent its {} twice", stage_, from, forward ? "hello" : "start");
  if (forward && (hello.start() || hello.steps_size() > static_cast<int>(kMaxHelloSteps) ||
                  hello.fingerprint().size() != kFingerprintBytes)) {
    fail(
        "stage {}: stage {} sent a hello with start {}, {} steps and a fingerprint of {} bytes "
        "(allowed: no start, at most {} steps, {} bytes)",
        stage_, from, hello.start(), hello.steps_size(), hello.fingerprint().size(), kMaxHelloSteps,
        kFingerprintBytes);
  }
  if (!forward && !hello.start()) {
    fail("stage {}: stage {} answered with a hello (allowed: the start)", stage_, from);
  }
  blamed_ = -1;
  slot = hello;
}

void StageLink::take(const wire::Envelope& message, BoundaryDirection expected) {
  const bool forward = expected == BoundaryDirection::kForward;
  const int64_t from = forward ? stage_ - 1 : stage_ + 1;
  if (!message.has_stage_data()) {
    blamed_ = from;
    fail("stage {}: stage {} sent a {} message (allowed: stage_data)", stage_, from,
         net::kind_name(message));
  }
  const wire::StageData& data = message.stage_data();
  if (!data.error().empty()) {
    // A stopped stage names the stage that failed first (itself, or the one that stopped it).
    blamed_ = static_cast<int64_t>(data.stage()) < stages_ ? data.stage() : from;
    fail("stage {}: stopping because stage {} stopped: {}", stage_, data.stage(), data.error());
  }
  (forward ? last_heard_prev_ : last_heard_next_) = Clock::now();
  if (data.has_hello()) {
    take_hello(data.hello(), expected);
    return;
  }
  blamed_ = from;  // until the message proves well-formed and in its place
  if (!(forward ? hello_ : start_)) {
    fail("stage {}: stage {} sent activations or gradients before the {} (allowed: the {} first)",
         stage_, from, forward ? "hello" : "start", forward ? "hello" : "start");
  }
  const BoundaryMessage decoded = decode_boundary(data.boundary());
  const BoundaryHeader& h = decoded.header;
  if (h.direction != expected || static_cast<int64_t>(h.stage) != from) {
    fail(
        "stage {}: a message from the {} neighbour claims direction {} from stage {} "
        "(allowed: direction {} from stage {})",
        stage_, forward ? "previous" : "next", static_cast<int>(h.direction), h.stage,
        static_cast<int>(expected), from);
  }
  if (static_cast<int64_t>(waiting_.size()) >= max_waiting_) {
    fail(
        "stage {}: stage {} sent more than {} messages ahead of this stage (allowed: the "
        "schedule's messages in flight)",
        stage_, from, max_waiting_);
  }
  const auto key = std::make_tuple(static_cast<int>(h.direction), static_cast<int64_t>(h.step),
                                   static_cast<int64_t>(h.micro_batch));
  if (!waiting_.emplace(key, data.boundary()).second) {
    fail("stage {}: stage {} sent step {} micro-batch {} twice", stage_, from, h.step,
         h.micro_batch);
  }
  blamed_ = -1;
}

}  // namespace agora::peer
