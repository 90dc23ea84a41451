// The RL learner's status page: the run's state (/api/rl's JSON) as one HTML page that reloads
// itself every few seconds, readable without JavaScript: step, reward and held-out accuracy, the
// rollouts by verdict, each worker's accepted and refused rollouts and strikes, and the newest
// updates. Every value from the JSON is HTML-escaped.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace agora {

std::string learner_page_html(const nlohmann::json& status);

}  // namespace agora
