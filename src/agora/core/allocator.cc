#include "agora/core/allocator.h"

#include <malloc.h>

namespace agora {

void tune_allocator_for_tensors() {
  // 32 MiB is glibc's largest mmap threshold on 64-bit; above it, blocks are still mmapped.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // Keep up to 1 GiB of freed heap top instead of trimming it back to the kernel.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace agora
