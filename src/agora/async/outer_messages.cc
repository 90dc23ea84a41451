#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "agora/async/outer_detail.h"
#include "agora/core/error.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/optim/payload_tensors.h"

namespace agora::outer_detail {

void Server::handle(const net::Incoming& in) {
  const auto admitted = workers_.admit(in.curve_key, now());
  switch (admitted.standing) {
    case serve::Standing::kThrottled:
      return;
    case serve::Standing::kStranger:
      if (in.message.has_async_hello()) return on_hello(in);
      server_.send(in.route, serve::refusal(serve::kNotAMember, /*may_rejoin=*/true));
      return;
    case serve::Standing::kBanned:
      if (in.message.has_async_hello()) return on_hello(in);
      if (in.message.has_async_get_work()) {
        wire::Envelope e;
        e.mutable_async_work()->set_refused(
            fmt::format("banned after {} strikes", admitted.member->strikes));
        reply(in.route, std::move(e));
      }
      return;
    case serve::Standing::kMember:
      break;
  }
  Worker& w = *admitted.member;
  if (in.message.has_async_hello()) return on_hello(in);
  if (in.message.has_get_blob() && data_ &&
      data_->answer(server_, in.curve_key, in.route, in.message.get_blob(), now())) {
    return;
  }
  if (in.message.has_get_params()) {
    // Only versions already saved go out: answered after this batch's save.
    after_save_.push_back(
        [this, route = in.route, ask = in.message.get_params(), curve = in.curve_key] {
          if (Worker* worker = workers_.find(curve)) on_get_params(route, ask, *worker);
        });
    return;
  }
  if (in.message.has_async_get_work()) return on_get_work(in, w);
  if (in.message.has_async_delivery()) return on_delivery(in, w);
}

void Server::on_hello(const net::Incoming& in) {
  const serve::Members<WorkerState>::Joined joined =
      workers_.join(in.curve_key, in.message.async_hello().key(), now());
  wire::Envelope e;
  auto* run = e.mutable_async_run();
  if (!joined.member) {
    run->set_refused(joined.refused);
  } else {
    Worker& w = *joined.member;
    if (joined.fresh) log({{"event", "async_worker"}, {"worker", w.name}, {"state", "joined"}});
    if (w.banned) run->set_refused(fmt::format("banned after {} strikes", w.strikes));
  }
  if (run->refused().empty()) {
    run->set_run_id(o_.run_id);
    run->set_method(o_.method);
    run->set_base_hash(base_hash_);
    run->set_version(published_.version());
    run->set_int8(o_.int8);
    run->set_sequences_per_step(static_cast<uint64_t>(sequences_per_step_));
  }
  reply(in.route, std::move(e));
}

void Server::on_get_params(const std::string& route, const wire::GetParams& ask, Worker& w) {
  int64_t queued = 0;
  for (const auto& [curve, other] : workers_) queued += other.in_flight->load();
  const serve::ParamFeed::Answer answer = feed_.answer(server_, route, ask, w.in_flight, queued);
  w.sent_version = std::max(w.sent_version, answer.reached);
}

void Server::on_get_work(const net::Incoming& in, Worker& w) {
  const uint64_t have = in.message.async_get_work().have_version();
  const uint64_t newest = published_.version();
  wire::Envelope e;
  auto* work = e.mutable_async_work();
  work->set_version(newest);
  const bool over = running() && run_seconds() >= o_.seconds;
  if (over) {
    work->set_finished(true);
  } else if (!running()) {
    work->set_retry_ms(200);  // waiting for the run's workers to join
  } else if (have != newest || w.sent_version < newest) {
    // Every method hands out work from the newest parameters: the worker fetches them first. A
    // worker claiming the newest that the feed never sent it (it lies, to deliver without
    // fetching, or it held them before this server restarted) fetches them too.
    work->set_retry_ms(0);
  } else if (w.work && w.work->version == newest) {
    // It asks again for work it holds (it restarted, or the answer was lost): the same work, so
    // a round under sync never waits for work nobody does.
    work->set_work_id(w.work->id);
    work->set_first_sequence(w.work->first_sequence);
    work->set_steps(static_cast<uint32_t>(w.work->steps));
  } else if (o_.method == "sync" &&
             (w.delivered_round == newest || round_handed_ >= serving() || round_overdue_)) {
    work->set_retry_ms(20);  // this round's work is out; the next round starts when it is in
  } else {
    lapse(w);
    Work next;
    next.id = next_work_++;
    next.version = newest;
    next.first_sequence = next_sequence_;
    next.steps = H_;
    if (o_.method == "dylu" && w.pace.known() && w.pace.seconds_per_step() > 0) {
      const double reference = dylu_reference_seconds(paces());
      next.steps = reference > 0 ? dylu_inner_steps(w.pace.seconds_per_step(), reference, H_) : H_;
    }
    next.handed_at = now();
    next_sequence_ += static_cast<uint64_t>(next.steps * sequences_per_step_);
    if (o_.method == "sync" && round_handed_++ == 0) round_started_ = now();
    work->set_work_id(next.id);
    work->set_first_sequence(next.first_sequence);
    work->set_steps(static_cast<uint32_t>(next.steps));
    w.work = next;
    dirty_ = true;
  }
  reply(in.route, std::move(e));
}

void Server::lapse(Worker& w) {
  if (w.work) dirty_ = true;
  if (w.work && o_.method == "sync" && w.work->version == published_.version()) ++round_resolved_;
  w.work.reset();
}

void Server::strike(Worker& w, const std::string& why) {
  ++w.strikes;
  if (w.strikes >= o_.max_strikes && !w.banned) {
    workers_.ban(w);
    lapse(w);
    log({{"event", "async_worker"},
         {"worker", w.name},
         {"state", "banned"},
         {"strikes", w.strikes},
         {"why", why}});
  }
}

std::vector<double> Server::paces(const Worker* except) const {
  std::vector<double> out;
  for (const auto& [curve, w] : workers_) {
    if (&w != except && !w.banned && w.pace.known() && w.pace.seconds_per_step() > 0) {
      out.push_back(w.pace.seconds_per_step());
    }
  }
  return out;
}

double Server::round_deadline() const {
  std::vector<double> known = paces();
  if (known.empty()) return o_.min_deadline * o_.deadline_factor;
  // The lower median: one slow (or lying) worker of two cannot stretch it.
  const auto mid = known.begin() + static_cast<std::ptrdiff_t>((known.size() - 1) / 2);
  std::nth_element(known.begin(), mid, known.end());
  return std::max(o_.min_deadline, o_.deadline_factor * static_cast<double>(H_) * *mid);
}

// sync: a round waits for every serving worker's piece. A worker that holds its piece past the
// deadline, or never asks for one, would hold the round (and the run) open for good; past the
// deadline its piece lapses, the round closes without it, and it is struck (async_worker
// "late" / "absent" events).
void Server::enforce_round_deadline() {
  if (o_.method != "sync" || round_started_ < 0 || round_overdue_ ||
      now() - round_started_ <= round_deadline()) {
    return;
  }
  const uint64_t newest = published_.version();
  std::vector<Worker*> late, absent;
  for (auto& [curve, w] : workers_) {
    if (w.banned) continue;
    if (w.work && w.work->version == newest) {
      late.push_back(&w);
    } else if (!w.work && w.delivered_round != newest) {
      absent.push_back(&w);
    }
  }
  for (Worker* w : late) {
    log({{"event", "async_worker"},
         {"worker", w->name},
         {"state", "late"},
         {"deadline", round_deadline()}});
    lapse(*w);
    strike(*w, "held its work past the round's deadline");
  }
  for (Worker* w : absent) {
    log({{"event", "async_worker"},
         {"worker", w->name},
         {"state", "absent"},
         {"deadline", round_deadline()}});
    strike(*w, "took no work within the round's deadline");
  }
  // Whoever took no work is not waited for: the round is what was handed out.
  round_overdue_ = true;
  dirty_ = true;
}

void Server::receipt(const net::Incoming& in, uint64_t work_id, std::string_view verdict,
                     const std::string& reason, Worker& w) {
  ++summary_.verdicts[std::string(verdict)];
  obs::counter(metrics_, obs::metric::kAsyncDeliveries, {{"verdict", std::string(verdict)}}).inc();
  if (verdict == kAccepted) ++w.accepted;
  if (strikes(verdict)) strike(w, std::string(verdict));
  wire::Envelope e;
  auto* r = e.mutable_async_receipt();
  r->set_work_id(work_id);
  r->set_verdict(std::string(verdict));
  r->set_reason(reason);
  r->set_version(published_.version());
  dirty_ = true;
  reply(in.route, std::move(e));
}

void Server::on_delivery(const net::Incoming& in, Worker& w) {
  const auto& d = in.message.async_delivery();
  nlohmann::json row = {{"event", "async_delivery"}, {"worker", w.name}, {"work_id", d.work_id()}};
  const auto refuse = [&](std::string_view verdict, const std::string& reason) {
    row["verdict"] = verdict;
    row["reason"] = reason.substr(0, 300);
    log(row);
    receipt(in, d.work_id(), verdict, reason, w);
  };
  if (!w.work || w.work->id != d.work_id()) {
    return refuse(kUnassigned,
                  fmt::format("work {} is not the work this worker holds", d.work_id()));
  }
  const Work work = *w.work;
  lapse(w);
  if (!net::verify_signature(w.key, delivery_signing_bytes(o_.run_id, d.work_id(), d.payload()),
                             d.signature())) {
    return refuse(
        kBadSignature,
        "the signature is not the worker's over delivery_signing_bytes(run, work, payload)");
  }
  Payload payload;
  try {
    payload = decode_payload(d.payload(), PublishedPolicy::layout(live_, /*whole=*/!o_.int8));
    if (payload.step != work.id)
      fail("the payload's step is {}, not the work id {}", payload.step, work.id);
  } catch (const Error& e) {
    return refuse(kMalformed, e.what());
  }
  // A stale delivery is honest work all the same, and its pace counts: a flood that makes every
  // honest delivery stale must not keep the pace median from forming (bench_poisoning_network,
  // tiny: 1665 instant deliveries in 90 s, every honest one stale, none judged).
  const double pace = (now() - work.handed_at) / static_cast<double>(work.steps);
  if (const auto why = too_soon(pace, paces(&w))) return refuse(kTooSoon, *why);
  const uint64_t staleness = published_.version() - work.version;
  row["staleness"] = staleness;
  row["steps"] = work.steps;
  if (static_cast<int64_t>(staleness) > o_.max_staleness) {
    w.pace.add(pace);
    return refuse(kStale, fmt::format("from version {}, {} versions behind (allowed: at most {})",
                                      work.version, staleness, o_.max_staleness));
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> delta;
  double sq = 0, theta_sq = 0;
  for (size_t i = 0; i < payload.tensors.size(); ++i) {
    delta.push_back(to_tensor(payload.tensors[i]));
    sq += delta.back().square().sum().item<double>();
    theta_sq += outer_.theta()[i].square().sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  row["norm"] = norm;
  if (const auto why = guard_.check(norm, std::sqrt(theta_sq), work.steps)) {
    return refuse(kOutlier, *why);
  }
  guard_.accept(w.name, norm, work.steps);
  w.pace.add(pace);
  summary_.tokens += work.steps * sequences_per_step_ * config_.data.seq_len;
  summary_.bytes_per_delivery = static_cast<double>(d.payload().size());
  staleness_sum_ += static_cast<int64_t>(staleness);
  last_staleness_ = static_cast<int64_t>(staleness);
  summary_.staleness_max =
      std::max<int64_t>(summary_.staleness_max, static_cast<int64_t>(staleness));
  ++accepted_;
  if (o_.method == "sync") {
    w.delivered_round = work.version;
    if (round_sum_.empty()) {
      round_sum_ = std::move(delta);
    } else {
      for (size_t i = 0; i < delta.size(); ++i) round_sum_[i].add_(delta[i]);
    }
    ++round_accepted_;
  } else {
    snapshot_due(false);  // copies due before this arrival see theta as it was
    apply(delta);
  }
  row["verdict"] = kAccepted;
  row["version"] = published_.version();
  log(row);
  receipt(in, d.work_id(), kAccepted, "", w);
}

}  // namespace agora::outer_detail
