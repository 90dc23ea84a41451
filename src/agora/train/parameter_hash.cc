#include "agora/train/parameter_hash.h"

#include <fmt/format.h>

#include "agora/core/hash.h"

namespace agora {

std::string parameter_hash(Llama& model) {
  Blake2bHasher hasher;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor cpu = item.value().detach().to(torch::kCPU).contiguous();
    hasher.update(fmt::format("{}|{}|{}|", item.key(), c10::str(cpu.sizes()),
                              c10::toString(cpu.scalar_type())));
    hasher.update(std::string_view(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes()));
  }
  return to_hex(hasher.finish());
}

}  // namespace agora
