#include "agora/core/allocator.h"

#include <malloc.h>

#include <cstdlib>

#include "agora/core/error.h"

namespace agora {

std::string allocator_mode() {
  const char* value = std::getenv("AGORA_MALLOC");
  if (value == nullptr || *value == '\0') return "tuned";
  const std::string mode = value;
  if (mode != "tuned" && mode != "system") {
    fail("AGORA_MALLOC=\"{}\" is not a known allocator setting (allowed: \"tuned\", the default, "
         "or \"system\" for glibc's defaults)",
         mode);
  }
  return mode;
}

void tune_allocator_for_tensors() {
  if (allocator_mode() == "system") return;
  mallopt(M_MMAP_MAX, 0);
  // Setting the thresholds by hand also turns off glibc's dynamic threshold, which would move the
  // trim threshold (the bound on the kept heap top) as blocks come and go.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace agora
