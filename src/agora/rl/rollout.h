// Rollout: one sampled completion of one problem, as a rollout worker submits it to a learner,
// and its wire format.
//
// A rollout names its problem by (task, task seed, problem id), never by text: the learner
// rebuilds the problem (task.h) and computes the reward with the checker, so a worker has no
// reward to lie about. It carries what the learner cannot recompute cheaply and must check: the
// completion's tokens, the policy version that sampled them, and the log-probability of each
// token under that policy (sampling.h), which GRPO's ratio needs and which the learner re-scores
// (rollout_intake.h). `sample` is the completion's index in its problem's group; with the
// worker's key it makes the rollout's identity, so a resubmission is recognised as one.
//
// Wire format, version 1, integers little-endian, floats IEEE 754 binary32 as their bits:
//
//   "AGRL" | u16 version = 1 | u8 task (1 arithmetic, 2 countdown, 3 arithmetic-worked) | u8 0
//   | u64 task_seed | u64 problem_id | u64 policy_version | u32 sample | u32 n | u32 tokens[n] | f32 logprobs[n]
//
// Header 40 bytes, so a message is exactly 40 + 8 n bytes.
//
// What decoding promises, for any bytes: a Rollout with 1 <= n <= limits.max_tokens tokens, each
// below limits.vocab_size (when set), and n log-probabilities, each finite, <= 0 (a
// probability is at most 1) and >= limits.min_logprob, or an Error naming the field, the value and what is allowed. It
// checks the length against n before it allocates, never reads out of bounds, and accepts no
// trailing byte. encode then decode gives the rollout back exactly.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

struct Rollout {
  std::string task;  // "arithmetic", "arithmetic-worked" or "countdown"
  uint64_t task_seed = 0;
  uint64_t problem_id = 0;
  uint64_t policy_version = 0;
  uint32_t sample = 0;
  std::vector<uint32_t> tokens;  // the end-of-text token last when the completion ended
  std::vector<float> logprobs;   // one per token

  bool operator==(const Rollout&) const = default;
};

struct RolloutLimits {
  uint32_t max_tokens = 1024;
  uint32_t vocab_size = 0;  // 0: token ids unchecked
  // The lowest log-probability accepted. A sampled token is never that unlikely (e^-50 is about
  // 2e-22), and a claim far below the truth makes GRPO's ratio exp(new - old) overflow; the
  // learner sets kMinRolloutLogprob. The default accepts any finite value.
  float min_logprob = -std::numeric_limits<float>::max();
};
inline constexpr float kMinRolloutLogprob = -50.0f;

inline constexpr size_t kRolloutHeaderBytes = 40;

// Error when the rollout could not be decoded back (an unknown task, no token, or tokens and
// log-probabilities of different counts).
std::string encode_rollout(const Rollout& rollout);
Rollout decode_rollout(std::string_view bytes, const RolloutLimits& limits);

// What a worker signs when it submits a rollout over the network (docs/rl.md section 6):
// "agora/rollout/v1" | u16 len(run_id) | run_id | the rollout's encoded bytes. The run id keeps
// a rollout signed for one run from being replayed into another.
std::string rollout_signing_bytes(std::string_view run_id, std::string_view rollout_bytes);

}  // namespace agora
