// workers.h: bench_trainer's measurements, each run in its own child process (--worker agora,
// --worker sgemm); each returns the JSON that the worker prints as one line on stdout.
#pragma once

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace agora::bench {

// The trainer's step on the case o.worker_case: warm-up steps, then o.repeats times the timed
// steps; gives parameters, threads, first_loss, last_loss, tokens_per_s (one per repeat), and
// over the timed steps faults_per_step (minor page faults) and system_share (kernel CPU time
// over all CPU time).
nlohmann::json agora_worker(const Options& o);

// The machine's ceiling: o.repeats times o.sgemm_iters float32 N x N torch::matmul calls; gives
// threads and gflops (one per repeat).
nlohmann::json sgemm_worker(const Options& o);

}  // namespace agora::bench
