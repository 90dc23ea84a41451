// The learner's status: the JSON of /api/rl (web/rl.html shows it) and the agora_rl_* metrics
// (learner_server.h).
#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/rl/learner_detail.h"
#include "agora/rl/rl_progress.h"

namespace agora::learner_detail {

void Learner::start_http() {
  http_ = std::make_unique<serve::StatusServer>(*options_.http, "rl", metrics_);
}

void Learner::publish_status() {
  const GrpoStepStats last = history_.empty() ? GrpoStepStats{} : history_.back();
  obs::gauge(metrics_, obs::metric::kRlStep).set(static_cast<double>(step_));
  obs::gauge(metrics_, obs::metric::kRlTotalSteps).set(static_cast<double>(options_.train.steps));
  obs::gauge(metrics_, obs::metric::kRlHeldOutAccuracy).set(last_held_out_);
  if (!history_.empty()) obs::gauge(metrics_, obs::metric::kRlReward).set(last.reward);
  obs::gauge(metrics_, obs::metric::kRlRolloutsPerSecond)
      .set(static_cast<double>(rollouts_) / std::max(1e-9, now()));
  int active = 0, banned = 0;
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& [curve, w] : workers_) {
    const bool is_banned = intake_.banned(w.name);
    (is_banned ? banned : active) += 1;
    workers.push_back({{"worker", w.name},
                       {"accepted", w.accepted},
                       {"refused", w.refused},
                       {"strikes", intake_.strikes(w.name)},
                       {"banned", is_banned},
                       {"holding", pool_.holding(w.name, now())}});
  }
  obs::gauge(metrics_, obs::metric::kRlWorkers, {{"state", "active"}}).set(active);
  obs::gauge(metrics_, obs::metric::kRlWorkers, {{"state", "banned"}}).set(banned);
  nlohmann::json steps = nlohmann::json::array();
  const size_t from = history_.size() > 200 ? history_.size() - 200 : 0;
  for (size_t i = from; i < history_.size(); ++i) steps.push_back(rl_step_json(history_[i]));
  nlohmann::json verdicts = receipts_;
  nlohmann::json status = {{"run_id", options_.run_id},
                           {"task", task_->name()},
                           {"step", step_},
                           {"steps", options_.train.steps},
                           {"version", published_.version()},
                           {"base_accuracy", summary_.base_accuracy},
                           {"held_out_accuracy", last_held_out_},
                           {"slots_filled", pool_.filled()},
                           {"slots", pool_.size()},
                           {"rollouts", rollouts_},
                           {"elapsed_s", now()},
                           {"finished", step_ >= options_.train.steps},
                           {"verdicts", verdicts},
                           {"workers", workers},
                           {"history", steps}};
  if (http_) http_->publish(std::move(status));
}

}  // namespace agora::learner_detail
