// Allocator tuning for tensor workloads.
//
// A training step allocates and frees the same large activation buffers over and over. glibc
// serves blocks above its mmap threshold with fresh mmap()s and returns freed heap tops to the
// kernel, so every step pays page faults for memory it just gave back (visible as system time
// in a CPU training run). Raising the thresholds keeps freed memory in the process for reuse.
#pragma once

namespace agora {

// Call once, early, in processes that run tensor code. Idempotent.
void tune_allocator_for_tensors();

}  // namespace agora
