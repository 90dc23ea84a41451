// Fuzzes the rollout decoder and the learner's intake: any bytes a worker sends must be refused
// with a verdict or accepted as a rollout that encodes back to the same bytes, without a crash,
// a read out of bounds or an allocation beyond the input's size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agora/core/error.h"
#include "agora/rl/rollout.h"
#include "agora/rl/rollout_intake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  agora::RolloutLimits limits;
  limits.vocab_size = 50257;
  limits.min_logprob = agora::kMinRolloutLogprob;  // as the learners set it
  try {
    const agora::Rollout r = agora::decode_rollout(bytes, limits);
    if (agora::encode_rollout(r) != bytes) std::abort();  // decoding loses or invents nothing
    for (float p : r.logprobs) {
      if (!(p >= agora::kMinRolloutLogprob && p <= 0)) std::abort();  // the promised range
    }
  } catch (const agora::Error&) {
  }
  agora::IntakeOptions options;
  options.task = "arithmetic";
  options.task_seed = 1;
  options.limits = limits;
  agora::RolloutIntake intake(options);
  intake.open(42);
  intake.set_version(3);
  const auto first = intake.submit("w", bytes);
  if (first.verdict == agora::IntakeVerdict::kAccepted &&
      intake.submit("w", bytes).verdict != agora::IntakeVerdict::kDuplicate) {
    std::abort();  // the same identity twice is always a duplicate
  }
  return 0;
}
