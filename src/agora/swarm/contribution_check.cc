#include "agora/swarm/contribution_check.h"

#include <fmt/format.h>

#include <memory>

#include "agora/core/error.h"
#include "agora/optim/chunking.h"
#include "agora/pipeline/partition.h"

namespace agora {

std::vector<PayloadLayout> swarm_contribution_layouts(const RunConfig& config) {
  std::vector<PayloadLayout> out;
  for (const StageSpan& span : partition_model(config.model, config.pipeline.stages)) {
    PayloadLayout layout;
    layout.kind = PayloadKind::kDemo;
    for (const ParameterShape& p : stage_parameter_shapes(config.model, span)) {
      layout.tensors.push_back(
          demo_tensor_layout(p.shape, config.demo.chunk, config.demo.topk, config.demo.one_bit));
    }
    out.push_back(std::move(layout));
  }
  return out;
}

std::function<std::string(int64_t stage, uint64_t step, const std::string& payload)>
contribution_checker(std::vector<PayloadLayout> layouts) {
  auto shared = std::make_shared<const std::vector<PayloadLayout>>(std::move(layouts));
  return [shared](int64_t stage, uint64_t step, const std::string& payload) -> std::string {
    if (stage < 0 || static_cast<size_t>(stage) >= shared->size()) {
      return fmt::format("stage {} has no layout", stage);
    }
    const PayloadLayout& layout = (*shared)[static_cast<size_t>(stage)];
    // The size first: a payload of another size is refused without reading it.
    const size_t expected = encoded_size(layout);
    if (payload.size() != expected) {
      return fmt::format("{} bytes, a DeMo payload of stage {} has {}", payload.size(), stage,
                         expected);
    }
    try {
      const Payload decoded = decode_payload(payload, layout);
      if (decoded.step != step) {
        return fmt::format("the payload is for step {}, the round for step {}", decoded.step, step);
      }
    } catch (const Error& e) {
      return std::string(e.what()).substr(0, 200);
    }
    return "";
  };
}

}  // namespace agora
