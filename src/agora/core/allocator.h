// Allocator tuning for tensor workloads.
//
// A training step allocates and frees the same large buffers every step: one micro-batch's
// logits at the demo's shapes (8 x 128 x 8192 floats) are 33.5 MB. glibc serves every block
// above its mmap threshold (at most 32 MiB, whatever mallopt asks) with a fresh mmap() and
// unmaps it on free, so each step faults those pages in again: measured on the tiny preset at
// 32 x 128 tokens, micro-batches of 8, 60 steps on 2 threads, 3.9 million minor faults and 32 s
// of system time in a 50 s run, against 0.08 million and 1 s with this tuning (15 s run, the same
// parameters bit for bit; docs/results.md, bench/trainer's "faults/step" column).
//
// What it sets, and what that promises:
//   - M_MMAP_MAX = 0: no block is mmapped on its own; every block comes from the heap (brk, or a
//     thread arena's heap), where a freed block is reused by the next request of its size. A
//     request the heap cannot grow for still gets memory: glibc falls back to mmap then.
//   - M_TRIM_THRESHOLD = 1 GiB, M_TOP_PAD = 64 MiB: the bound on what is kept. The heap's free
//     top is returned to the kernel once it exceeds 1 GiB; below that it stays for the next
//     step. Freed blocks inside the heap stay too, so a process holds at most its peak heap:
//     the peak RSS does not grow (422 MB with glibc's defaults, 426 MB tuned, in the run above).
//
// AGORA_MALLOC=system in the environment leaves glibc's defaults untouched (to compare, or where
// a process must give memory back between bursts more than it must be fast). Any other value
// than "system" or "tuned" (the default) is refused with an error naming the allowed values.
#pragma once

#include <string>

namespace agora {

// Call once, early, in processes that run tensor code. Idempotent. Throws Error for an
// AGORA_MALLOC other than "tuned" or "system".
void tune_allocator_for_tensors();

// "tuned" or "system": what tune_allocator_for_tensors() applied (or would apply), from
// AGORA_MALLOC. Throws Error for another value.
std::string allocator_mode();

}  // namespace agora
