// The outer server's durability (outer_server.h, "Restarts"): what it has told its workers is
// saved before it is sent, and a restart with the same --out resumes from the last save.
#include <fmt/format.h>

#include "agora/async/outer_detail.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"

namespace agora::outer_detail {

void Server::reply(const std::string& route, wire::Envelope e) {
  after_save_.push_back([this, route, e = std::move(e)] { server_.send(route, e); });
}

std::string Server::fingerprint() const {
  // What changes the numbers: a state saved under other values cannot be resumed under these.
  return fmt::format(
      "{}\n[async]\nrun_id={}\nmethod={}\nworkers={}\nH={}\nint8={}\nouter_lr={}\n"
      "outer_momentum={}\nseconds={}\neval_every={}\n",
      config_.to_toml(), o_.run_id, o_.method, o_.workers, H_, o_.int8, o_.outer_lr,
      o_.outer_momentum, o_.seconds, o_.eval_every);
}

nlohmann::json Server::durable_state(bool finished) const {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& [curve, w] : workers_) {
    nlohmann::json row = {{"curve", net::key_to_hex(curve)},
                          {"key", w.name},
                          {"strikes", w.strikes},
                          {"accepted", w.accepted},
                          {"banned", w.banned},
                          {"delivered_round", w.delivered_round}};
    if (w.work) {
      row["work"] = {{"id", w.work->id},
                     {"version", w.work->version},
                     {"first_sequence", w.work->first_sequence},
                     {"steps", w.work->steps}};
    }
    workers.push_back(std::move(row));
  }
  nlohmann::json snapshots = nlohmann::json::array();
  for (const Snapshot& s : snapshots_) {
    snapshots.push_back({{"index", s.index},
                         {"seconds", s.point.seconds},
                         {"tokens", s.point.tokens},
                         {"updates", s.point.updates}});
  }
  return {{"finished", finished},
          {"version", published_.version()},
          {"updates", outer_.updates()},
          {"next_work", next_work_},
          {"next_sequence", next_sequence_},
          {"run_seconds", !running() ? -1.0 : run_seconds()},
          {"next_snapshot", next_snapshot_},
          {"snapshots", snapshots},
          {"tokens", summary_.tokens},
          {"verdicts", summary_.verdicts},
          {"staleness_sum", staleness_sum_},
          {"staleness_max", summary_.staleness_max},
          {"last_staleness", last_staleness_},
          {"accepted", accepted_},
          {"bytes_per_delivery", summary_.bytes_per_delivery},
          {"guard", guard_.recent()},
          {"round", {round_accepted_, round_resolved_, round_handed_}},
          {"workers", workers}};
}

void Server::persist() {
  if (dirty_) {
    crash_point("async_server.before_save");
    const bool moved = outer_.updates() != saved_updates_ ||
                       (o_.method == "sync" && round_accepted_ != saved_round_accepted_);
    OuterTensors tensors;
    if (moved) {
      tensors.theta = outer_.theta();
      tensors.momentum = outer_.momentum();
      for (const auto& p : published_.model()->parameters()) tensors.published.push_back(p);
      tensors.round_sum = round_sum_;
    }
    store_->save(durable_state(/*finished=*/false), moved ? &tensors : nullptr);
    saved_updates_ = outer_.updates();
    saved_round_accepted_ = round_accepted_;
    dirty_ = false;
    crash_point("async_server.after_save");
  }
  std::vector<std::function<void()>> due;
  due.swap(after_save_);
  for (auto& send : due) send();
}

void Server::restore(const OuterSave& save) {
  const nlohmann::json& s = save.state;
  const OuterTensors& t = save.tensors;
  outer_.restore(t.theta, t.momentum, s.at("updates").get<int64_t>());
  {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& p : live_->parameters()) p.copy_(outer_.theta()[i++]);
    // The published copy as workers hold it: deltas go on from it bit for bit.
    Llama published(live_->config());
    i = 0;
    if (t.published.size() != outer_.theta().size())
      fail("{}: the saved published copy has {} tensors", store_->dir().string(),
           t.published.size());
    for (auto& p : published->parameters()) p.copy_(t.published[i++]);
    published_ = PublishedPolicy(published, s.at("version").get<uint64_t>());
    feed_.reset(published_.version(), published_.state_hash());
  }
  round_sum_ = t.round_sum;
  next_work_ = s.at("next_work").get<uint64_t>();
  next_sequence_ = s.at("next_sequence").get<uint64_t>();
  const double ran = s.at("run_seconds").get<double>();
  // The run's clock stopped while the server was down: it goes on from where it was.
  if (ran >= 0) started_run_ = now() - ran;
  next_snapshot_ = s.at("next_snapshot").get<double>();
  for (const nlohmann::json& j : s.at("snapshots")) {
    Snapshot snap;
    snap.index = j.at("index").get<int64_t>();
    snap.point.seconds = j.at("seconds").get<double>();
    snap.point.tokens = j.at("tokens").get<int64_t>();
    snap.point.updates = j.at("updates").get<int64_t>();
    snapshots_.push_back(snap);
  }
  summary_.tokens = s.at("tokens").get<int64_t>();
  summary_.verdicts = s.at("verdicts").get<std::map<std::string, int64_t>>();
  staleness_sum_ = s.at("staleness_sum").get<int64_t>();
  summary_.staleness_max = s.at("staleness_max").get<int64_t>();
  last_staleness_ = s.at("last_staleness").get<int64_t>();
  accepted_ = s.at("accepted").get<int64_t>();
  summary_.bytes_per_delivery = s.at("bytes_per_delivery").get<double>();
  // A save from before the guard kept its history per worker holds a plain list: start afresh.
  if (s.at("guard").is_object()) {
    guard_.restore(s.at("guard").get<std::map<std::string, std::vector<double>>>());
  }
  const auto round = s.at("round").get<std::vector<int64_t>>();
  round_accepted_ = round.at(0);
  round_resolved_ = round.at(1);
  round_handed_ = round.at(2);
  round_started_ = round_handed_ > 0 ? now() : -1;  // the deadline starts again here
  // Workers come back as members: a delivery already on its way is taken as if nothing
  // happened, and a ban stays a ban.
  for (const nlohmann::json& j : s.at("workers")) {
    const std::string curve = net::key_from_hex(j.at("curve").get<std::string>(), "curve key");
    const std::string key = net::key_from_hex(j.at("key").get<std::string>(), "worker key");
    Worker* w = workers_.join(curve, key, now()).member;
    if (!w) continue;  // the run now serves fewer workers
    w->strikes = j.at("strikes").get<int>();
    w->accepted = j.at("accepted").get<int64_t>();
    w->delivered_round = j.at("delivered_round").get<uint64_t>();
    if (j.contains("work")) {
      Work work;
      work.id = j["work"].at("id").get<uint64_t>();
      work.version = j["work"].at("version").get<uint64_t>();
      work.first_sequence = j["work"].at("first_sequence").get<uint64_t>();
      work.steps = j["work"].at("steps").get<int64_t>();
      work.handed_at = now();
      w->work = work;
    }
    if (j.at("banned").get<bool>()) workers_.ban(*w);
  }
  saved_updates_ = outer_.updates();
  saved_round_accepted_ = round_accepted_;
  resumed_ = true;
}

}  // namespace agora::outer_detail
