// The strategy a run config names, built over a model's parameters.
//
// Parameters keep the model's order and names (they key the strategy's state in checkpoints);
// weight decay applies to matrices (dim >= 2) only, never to norms.
#pragma once

#include <memory>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/model/llama.h"
#include "agora/optim/strategy.h"

namespace agora {

std::vector<NamedParameter> named_parameters(Llama& model);

// optimizer.name: "demo" (the [demo] section), "adamw" (all-reduce AdamW, [adamw]) or "diloco"
// (inner AdamW with optimizer.*, outer Nesterov SGD, [diloco]). Throws Error for another name.
std::unique_ptr<Strategy> make_strategy(const RunConfig& config, Llama& model);

}  // namespace agora
