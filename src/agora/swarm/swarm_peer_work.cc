// The replica process (swarm_peer.h): micro-batches. Forwards in, backwards back, stage 0's
// micro-batches out and sent again, routing by SwarmRouter, the pace of a slower machine.
#include <algorithm>
#include <thread>

#include "agora/serve/poll.h"
#include "agora/swarm/swarm_peer_detail.h"

namespace agora::swarm_detail {

namespace {

// The gradient a replica sends back for its input; a "garbage" replica (bench/poisoning) sends
// it negated and 100 times as large: nothing downstream can tell routed work from honest work.
torch::Tensor sent_gradient(const torch::Tensor& honest, const std::string& behave) {
  return behave == "garbage" ? honest.neg() * 100 : honest;
}

}  // namespace

void SwarmPeer::serve(const net::Incoming& in) {
  if (in.message.has_get_tensor()) return answer_tensor(in);
  if (!in.message.has_swarm_hop() || in.message.swarm_hop().backward()) return;
  if (waiting_.size() + strangers_.size() >= kMaxWaiting) {
    ++ignored_;
    return;
  }
  if (prev_curves_.count(in.curve_key) == 0) {
    // Perhaps a member that joined the previous stage since this replica's last view: asked
    // about at once, kept until the answer says (admit()).
    strangers_.push_back({in.curve_key, {in.route, in.message.swarm_hop()}});
    report_now_ = true;
    return;
  }
  if (o_.behave == "liar") {
    for (uint32_t k = 0; k < 4; ++k) {
      wire::SwarmHop hop = in.message.swarm_hop();
      hop.set_attempt(hop.attempt() + k);
      reply(in.route, hop, "liar", 0.0f, 1e-30);
    }
    return;
  }
  waiting_.push_back({in.route, in.message.swarm_hop()});
}

bool SwarmPeer::pump() {
  bool any = false;
  for (int n = 0; n < 64; ++n) {
    std::optional<net::Incoming> in = server_.recv();
    if (!in) break;
    serve(*in);
    any = true;
  }
  while (std::optional<wire::Envelope> m = coordinator_.recv()) {
    if (m->has_swarm_view()) on_view(m->swarm_view());
    if (m->has_refused()) on_refused(m->refused());
    any = true;
    if (finished_) return true;
  }
  for (auto& [key, client] : clients_) {
    for (int n = 0; n < 64; ++n) {
      std::optional<wire::Envelope> m = client->recv();
      if (!m) break;
      any = true;
      if (m->has_swarm_hop() && m->swarm_hop().backward()) {
        if (backwards_.size() >= kMaxWaiting) {  // more than this replica ever sent on
          ++ignored_;
          continue;
        }
        arrived(m->swarm_hop());
        backwards_.push_back({key, m->swarm_hop()});
      }
    }
  }
  if (fetch_) {
    while (fetch_ && fetch_->client) {
      std::optional<wire::Envelope> m = fetch_->client->recv();
      if (!m) break;
      any = true;
      on_tensor(*m);
    }
  }
  return any;
}

// Stage 0: a micro-batch's round trip, from its send to its gradient's arrival (not counting the
// time it then waits for this replica's own compute).
void SwarmPeer::arrived(const wire::SwarmHop& hop) {
  if (stage_ != 0 || hop.lost()) return;
  const auto it = origin_.find(hop.micro_batch());
  if (it == origin_.end() || it->second.attempt != hop.attempt() || !it->second.sent) return;
  const double trip = seconds_since(it->second.sent_at);
  round_trip_ = round_trips_++ == 0 ? trip : 0.9 * round_trip_ + 0.1 * trip;
}

void SwarmPeer::wait_for_messages() {
  std::vector<zmq::pollitem_t> items;
  items.push_back({server_.socket().handle(), 0, ZMQ_POLLIN, 0});
  items.push_back({coordinator_.socket().handle(), 0, ZMQ_POLLIN, 0});
  for (auto& [key, client] : clients_)
    items.push_back({client->socket().handle(), 0, ZMQ_POLLIN, 0});
  if (fetch_ && fetch_->client)
    items.push_back({fetch_->client->socket().handle(), 0, ZMQ_POLLIN, 0});
  serve::poll(items, std::chrono::milliseconds(5));  // a signal: the loop's stop flag ends the run
}

bool SwarmPeer::compute() {
  if (!ready_ || version_ != step_) {
    backwards_.clear();
    return false;
  }
  if (!backwards_.empty()) {
    auto [from, hop] = std::move(backwards_.front());
    backwards_.pop_front();
    if (hop.step() == version_) backward(from, hop);
    return true;
  }
  if (phase_ != "training") return false;
  // Forwards of an older step are dropped; of a newer one (a sender that saw the step begin
  // first), kept until this replica is there.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second.step() < version_) {
      it = waiting_.erase(it);
      continue;
    }
    if (it->second.step() > version_) {
      ++it;
      continue;
    }
    auto [route, hop] = std::move(*it);
    waiting_.erase(it);
    forward(route, hop);
    return true;
  }
  if (!unsent_.empty() && !next_.empty()) {
    const Unsent u = std::move(unsent_.front());
    unsent_.pop_front();
    std::string replica;
    if (send_on(version_, u.micro_batch, u.attempt, u.bytes, &replica)) {
      if (const auto h = held_.find({u.micro_batch, u.attempt}); h != held_.end()) {
        h->second.replica = replica;
        h->second.sent_at = Clock::now();
      }
      return true;
    }
    unsent_.push_front(u);  // every replica there is being skipped: wait
    return false;
  }
  if (stage_ != 0) {
    expire_held();
    return false;
  }
  if (resend_due()) return true;
  if (!assigned_.empty() && static_cast<int64_t>(origin_.size()) < o_.in_flight) {
    const uint32_t j = assigned_.front();
    assigned_.pop_front();
    start(j);
    return true;
  }
  return false;
}

torch::Tensor SwarmPeer::windows(uint64_t step, uint32_t j) const {
  return read_sequences(data_,
                        step * static_cast<uint64_t>(M_ * m_) + j * static_cast<uint64_t>(m_), m_);
}

BoundaryPosition SwarmPeer::position(uint64_t step, uint32_t j, int64_t stage) const {
  return {step, j, static_cast<uint32_t>(stage)};
}

double SwarmPeer::pace(Clock::time_point started, double share) {
  if (o_.pace_unit > 0) {
    const double target = o_.pace_unit * costs_[static_cast<size_t>(stage_)] / o_.speed *
                          static_cast<double>(m_) * share;
    const double left = target - seconds_since(started);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }
  return seconds_since(started);
}

void SwarmPeer::measured(double seconds) {
  const double sps = seconds / static_cast<double>(m_);
  ++measured_;
  seconds_per_sample_ = measured_ == 1 ? sps : 0.8 * seconds_per_sample_ + 0.2 * sps;
}

bool SwarmPeer::send_on(uint64_t step, uint32_t j, uint32_t attempt, const std::string& bytes,
                        std::string* replica) {
  const std::optional<uint64_t> id = router_.pick(m_, now());
  if (!id) return false;
  *replica = by_id_.at(*id);
  wire::Envelope e;
  auto* hop = e.mutable_swarm_hop();
  hop->set_step(step);
  hop->set_micro_batch(j);
  hop->set_attempt(attempt);
  hop->set_boundary(bytes);
  clients_.at(*replica)->send(e);
  return true;
}

void SwarmPeer::start(uint32_t j) {
  const auto started = Clock::now();
  const torch::Tensor tokens = windows(version_, j).narrow(1, 0, config_.data.seq_len);
  Origin f;
  f.output = model_->forward(tokens);
  f.bytes = coder_->encode_forward(position(version_, j, 0), f.output, tokens);
  f.forward_seconds = pace(started, 1.0 / 3);
  ++summary_.forwards;
  f.attempt = next_attempt_++;
  f.sent = send_on(version_, j, f.attempt, f.bytes, &f.replica);
  f.sent_at = Clock::now();
  origin_[j] = std::move(f);
}

bool SwarmPeer::resend_due() {
  const double grace = std::max(1.0, 2 * round_trip_);
  for (auto& [j, f] : origin_) {
    const bool gone = f.sent && next_.count(f.replica) == 0;
    const bool lost = f.suspect && seconds_since(f.suspect_at) >= grace;
    const bool timed_out = f.sent && seconds_since(f.sent_at) >= o_.timeout_seconds;
    if (f.sent && !gone && !lost && !timed_out) continue;
    // The replica it went to left, or kept it past the timeout (it dropped it, or lies about its
    // pace): skipped for a while. A loss elsewhere on the path (lost) is not its fault.
    if (gone || (timed_out && !lost)) {
      router_.failed(router_id(f.replica), now());
      if (!gone) send_timed_out(j, f.attempt, f.replica);
    } else if (f.sent && f.earlier.size() < 16) {
      f.earlier[f.attempt] = f.replica;  // it may still answer
    }
    f.attempt = next_attempt_++;
    f.suspect = false;
    const bool was_sent = f.sent;
    f.sent = send_on(version_, j, f.attempt, f.bytes, &f.replica);
    f.sent_at = Clock::now();
    if (f.sent && was_sent) ++retried_;
    if (f.sent) return true;
  }
  return false;
}

void SwarmPeer::forward(const std::string& route, const wire::SwarmHop& hop) {
  const auto started = Clock::now();
  const uint32_t j = hop.micro_batch();
  if (j >= static_cast<uint32_t>(M_)) return;
  const torch::Tensor w = windows(version_, j);
  const torch::Tensor tokens = w.narrow(1, 0, config_.data.seq_len);
  torch::Tensor in;
  try {
    in =
        coder_
            ->decode_forward(hop.boundary(), position(version_, j, stage_ - 1), tokens, torch::kCPU)
            .requires_grad_(true);
  } catch (const Error& e) {
    event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
    return;
  }
  ++summary_.forwards;
  if (span_.head) {
    const torch::Tensor logits = model_->forward(in);
    const torch::Tensor loss =
        next_token_loss(logits, w.narrow(1, 1, config_.data.seq_len)) / static_cast<double>(M_);
    const double forward_seconds = pace(started, 1.0 / 3);
    const auto back = Clock::now();
    loss.backward();
    const std::string bytes = coder_->encode_backward(position(version_, j, stage_),
                                                      sent_gradient(in.grad(), o_.behave), in);
    const double seconds = forward_seconds + pace(back, 2.0 / 3);
    measured(seconds);
    ++summary_.backwards;
    reply(route, hop, bytes, loss.item<float>() * static_cast<float>(M_), seconds);
    return;
  }
  Held h;
  h.route = route;
  h.attempt = hop.attempt();
  h.input = in;
  h.output = model_->forward(in);
  const std::string bytes = coder_->encode_forward(position(version_, j, stage_), h.output, tokens);
  h.forward_seconds = pace(started, 1.0 / 3);
  const uint32_t mine = next_attempt_++;
  // No replica of the next stage serving yet: sent as soon as one is.
  if (send_on(version_, j, mine, bytes, &h.replica)) {
    h.sent_at = Clock::now();
  } else {
    unsent_.push_back({j, mine, bytes});
  }
  if (held_.size() >= 4 * static_cast<size_t>(M_) + kMaxWaiting) held_.erase(held_.begin());
  held_[{j, mine}] = std::move(h);
}

void SwarmPeer::reply(const std::string& route, const wire::SwarmHop& hop, const std::string& bytes,
                      float loss, double seconds) {
  wire::Envelope e;
  auto* b = e.mutable_swarm_hop();
  b->set_step(hop.step());
  b->set_micro_batch(hop.micro_batch());
  b->set_attempt(hop.attempt());
  b->set_backward(true);
  b->set_boundary(bytes);
  b->set_loss(loss);
  b->set_seconds(static_cast<float>(seconds));
  server_.send(route, e);
}

// Only an answer to an attempt this replica has out to `from`, and that decodes, counts for the
// router, with the compute time it reports bounded by the round trip measured here: unsolicited
// or garbled answers with a tiny time cannot make a replica the router's choice (issue 38,
// finding 3).
void SwarmPeer::backward(const std::string& from, const wire::SwarmHop& hop) {
  if (hop.lost()) return lost_past(from, hop);
  const uint32_t j = hop.micro_batch();
  const auto started = Clock::now();
  const int64_t crossed = S_ - 1 - stage_;  // the stages after this one
  if (stage_ == 0) {
    const auto it = origin_.find(j);
    if (it == origin_.end()) return;
    if (it->second.attempt != hop.attempt() || !it->second.sent || it->second.replica != from) {
      // An earlier attempt sent to `from`: the micro-batch went again, but the replica did the
      // work, so its share in the router is freed (no measurement: the gradient is not used).
      const auto earlier = it->second.earlier.find(hop.attempt());
      if (earlier != it->second.earlier.end() && earlier->second == from) {
        router_.answered(router_id(from), m_, 0.0);
        it->second.earlier.erase(earlier);
      }
      return;
    }
    Origin& f = it->second;
    try {
      f.output.backward(coder_->decode_backward(hop.boundary(), position(version_, j, 1),
                                                f.output.size(0), f.output.size(1), torch::kCPU));
    } catch (const Error& e) {
      event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
      garbled(from, j, f.attempt);
      f.sent = false;  // resend_due() sends it again now, to another replica
      return;
    }
    router_.answered(router_id(from), m_,
                     counted_seconds(hop.seconds(), seconds_since(f.sent_at), crossed));
    measured(f.forward_seconds + pace(started, 2.0 / 3));
    ++summary_.backwards;
    done_.emplace_back(j, hop.loss());
    origin_.erase(it);
    return;
  }
  const auto it = held_.find({j, hop.attempt()});
  if (it == held_.end() || it->second.replica != from) return;
  Held& h = it->second;
  try {
    h.output.backward(coder_->decode_backward(hop.boundary(), position(version_, j, stage_ + 1),
                                              h.output.size(0), h.output.size(1), torch::kCPU));
  } catch (const Error& e) {
    event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
    garbled(from, j, hop.attempt());
    wire::SwarmHop back;  // not this replica's fault: its sender sends it again
    back.set_step(version_);
    back.set_micro_batch(j);
    back.set_attempt(h.attempt);
    back.set_lost(true);
    reply(h.route, back, "", 0.0f, 0.0);
    held_.erase(it);
    return;
  }
  router_.answered(router_id(from), m_,
                   counted_seconds(hop.seconds(), seconds_since(h.sent_at), crossed));
  const std::string bytes =
      coder_->encode_backward(position(version_, j, stage_), sent_gradient(h.input.grad(), o_.behave), h.input);
  const double seconds = h.forward_seconds + pace(started, 2.0 / 3);
  measured(seconds);
  ++summary_.backwards;
  wire::SwarmHop back = hop;
  back.set_attempt(h.attempt);
  reply(h.route, back, bytes, hop.loss(), seconds);
  held_.erase(it);
}

void SwarmPeer::expire_held() {
  for (auto it = held_.begin(); it != held_.end();) {
    const Held& h = it->second;
    if (h.replica.empty() || seconds_since(h.sent_at) < o_.timeout_seconds) {
      ++it;
      continue;
    }
    if (next_.count(h.replica) != 0) {
      router_.failed(router_id(h.replica), now());
      send_timed_out(it->first.first, it->first.second, h.replica);
    }
    wire::SwarmHop back;  // not this replica's fault: its sender must not blame it
    back.set_step(version_);
    back.set_micro_batch(it->first.first);
    back.set_attempt(h.attempt);
    back.set_lost(true);
    reply(h.route, back, "", 0.0f, 0.0);
    it = held_.erase(it);
  }
}

void SwarmPeer::send_timed_out(uint32_t j, uint32_t attempt, const std::string& replica) {
  // Each stage past `replica` times out its own send a little after this one did; half a
  // timeout each is room for its compute and the answer's way back.
  const auto after = static_cast<double>(std::max<int64_t>(0, S_ - 2 - stage_));
  const auto due =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(after * 0.5 * o_.timeout_seconds));
  if (pending_drops_.size() >= 4 * static_cast<size_t>(M_) + kMaxWaiting) {
    pending_drops_.erase(pending_drops_.begin());
  }
  pending_drops_[{j, attempt}] = {replica, version_, due};
}

void SwarmPeer::garbled(const std::string& from, uint32_t j, uint32_t attempt) {
  router_.failed(router_id(from), now());
  // The answer came over `from`'s own authenticated connection and does not decode: the work
  // is lost by `from` itself, with no stage after it to share the blame. Named at the next poll.
  if (pending_drops_.size() >= 4 * static_cast<size_t>(M_) + kMaxWaiting) {
    pending_drops_.erase(pending_drops_.begin());
  }
  pending_drops_[{j, attempt}] = {from, version_, Clock::now()};
}

void SwarmPeer::lost_past(const std::string& from, const wire::SwarmHop& hop) {
  const uint32_t j = hop.micro_batch();
  const auto pending = pending_drops_.find({j, hop.attempt()});
  if (pending != pending_drops_.end() && pending->second.replica == from) {
    pending_drops_.erase(pending);
  }
  // The last stage sends nothing on: a `lost` from it is its own loss, however it is worded.
  if (stage_ + 2 == S_) garbled(from, j, hop.attempt());
  if (stage_ == 0) {
    const auto it = origin_.find(j);
    if (it == origin_.end()) return;
    Origin& f = it->second;
    if (f.sent && f.attempt == hop.attempt() && f.replica == from) {
      router_.answered(router_id(from), m_, 0.0);  // its share is free; no measurement
      f.sent = false;                              // resend_due() sends it again now
      ++retried_;
    } else if (const auto e = f.earlier.find(hop.attempt());
               e != f.earlier.end() && e->second == from) {
      router_.answered(router_id(from), m_, 0.0);
      f.earlier.erase(e);
    }
    return;
  }
  const auto it = held_.find({j, hop.attempt()});
  if (it == held_.end() || it->second.replica != from) return;
  router_.answered(router_id(from), m_, 0.0);
  wire::SwarmHop back = hop;
  back.set_attempt(it->second.attempt);
  reply(it->second.route, back, "", 0.0f, 0.0);
  held_.erase(it);
}

void SwarmPeer::name_drops() {
  if (dropped_version_ != version_) {
    dropped_.clear();
    dropped_version_ = version_;
  }
  const auto now = Clock::now();
  for (auto it = pending_drops_.begin(); it != pending_drops_.end();) {
    if (it->second.version != version_) {
      it = pending_drops_.erase(it);
    } else if (now >= it->second.due) {
      dropped_.insert(it->second.replica);
      it = pending_drops_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace agora::swarm_detail
