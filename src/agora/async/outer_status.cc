// The outer server's status: the JSON of /api/async (web/async.html shows it) and the
// agora_async_* metrics (outer_server.h).
#include "agora/async/outer_detail.h"
#include "agora/obs/metrics_catalogue.h"

namespace agora::outer_detail {

void Server::start_http() {
  http_ = std::make_unique<serve::StatusServer>(*o_.http, "async", metrics_);
}

void Server::publish_status() {
  last_status_ = now();
  obs::gauge(metrics_, obs::metric::kAsyncUpdates).set(static_cast<double>(outer_.updates()));
  obs::gauge(metrics_, obs::metric::kAsyncTokens).set(static_cast<double>(summary_.tokens));
  obs::gauge(metrics_, obs::metric::kAsyncStaleness).set(static_cast<double>(last_staleness_));
  obs::gauge(metrics_, obs::metric::kAsyncRunSeconds).set(run_seconds());
  int active = 0, banned = 0;
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& [curve, w] : workers_) {
    (w.banned ? banned : active) += 1;
    workers.push_back({{"worker", w.name},
                       {"accepted", w.accepted},
                       {"strikes", w.strikes},
                       {"banned", w.banned},
                       {"working", w.work.has_value()},
                       {"seconds_per_step", w.pace.known() ? w.pace.seconds_per_step() : 0.0}});
  }
  obs::gauge(metrics_, obs::metric::kAsyncWorkers, {{"state", "active"}}).set(active);
  obs::gauge(metrics_, obs::metric::kAsyncWorkers, {{"state", "banned"}}).set(banned);
  nlohmann::json status = {{"run_id", o_.run_id},
                           {"method", o_.method},
                           {"state", !running()                   ? "waiting"
                                     : run_seconds() < o_.seconds ? "training"
                                                                  : "finishing"},
                           {"workers_needed", o_.workers},
                           {"run_seconds", run_seconds()},
                           {"seconds", o_.seconds},
                           {"version", published_.version()},
                           {"tokens", summary_.tokens},
                           {"verdicts", summary_.verdicts},
                           {"workers", workers}};
  if (http_) http_->publish(std::move(status));
}

}  // namespace agora::outer_detail
