// Kept in its own file: the libtorch version header is cheap, <torch/torch.h> is not.
#include <torch/version.h>

#include <string>

#include "commands.h"

namespace agora::cli {

std::string version_string() {
  return std::string("agora ") + AGORA_VERSION + " (built with libtorch " + TORCH_VERSION + ")";
}

}  // namespace agora::cli
