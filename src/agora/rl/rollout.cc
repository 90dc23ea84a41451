#include "agora/rl/rollout.h"

#include <cmath>
#include <cstring>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"

namespace agora {
namespace {

constexpr char kMagic[4] = {'A', 'G', 'R', 'L'};
constexpr uint16_t kVersion = 1;

uint8_t task_code(std::string_view task) {
  if (task == "arithmetic") return 1;
  if (task == "countdown") return 2;
  if (task == "arithmetic-worked") return 3;
  fail("rollout: unknown task '{}' (allowed: arithmetic, arithmetic-worked, countdown)", task);
}

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

}  // namespace

std::string encode_rollout(const Rollout& r) {
  if (r.tokens.empty() || r.tokens.size() != r.logprobs.size()) {
    fail("rollout: {} tokens and {} log-probabilities (expected the same count, at least one)",
         r.tokens.size(), r.logprobs.size());
  }
  std::string out(kMagic, sizeof kMagic);
  append_le(out, kVersion, 2);
  append_le(out, task_code(r.task), 1);
  append_le(out, 0, 1);
  append_le(out, r.task_seed, 8);
  append_le(out, r.problem_id, 8);
  append_le(out, r.policy_version, 8);
  append_le(out, r.sample, 4);
  append_le(out, r.tokens.size(), 4);
  for (uint32_t t : r.tokens) append_le(out, t, 4);
  for (float p : r.logprobs) append_le(out, float_to_bits(p), 4);
  return out;
}

Rollout decode_rollout(std::string_view bytes, const RolloutLimits& limits) {
  if (bytes.size() < kRolloutHeaderBytes) {
    fail("rollout: {} bytes, shorter than the {}-byte header", bytes.size(), kRolloutHeaderBytes);
  }
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) fail("rollout: bad magic (expected 'AGRL')");
  const uint16_t version = load_le16(p + 4);
  if (version != kVersion) fail("rollout: version {} (allowed: {})", version, kVersion);
  Rollout r;
  switch (p[6]) {
    case 1:
      r.task = "arithmetic";
      break;
    case 2:
      r.task = "countdown";
      break;
    case 3:
      r.task = "arithmetic-worked";
      break;
    default:
      fail("rollout: task code {} (allowed: 1 arithmetic, 2 countdown, 3 arithmetic-worked)",
           p[6]);
  }
  if (p[7] != 0) fail("rollout: reserved byte {} (allowed: 0)", p[7]);
  r.task_seed = load_le64(p + 8);
  r.problem_id = load_le64(p + 16);
  r.policy_version = load_le64(p + 24);
  r.sample = load_le32(p + 32);
  const uint32_t n = load_le32(p + 36);
  if (n == 0 || n > limits.max_tokens) {
    fail("rollout: {} tokens (allowed: 1 to {})", n, limits.max_tokens);
  }
  const uint64_t expected = kRolloutHeaderBytes + 8 * uint64_t{n};
  if (bytes.size() != expected) {
    fail("rollout: {} bytes for {} tokens (expected exactly {})", bytes.size(), n, expected);
  }
  r.tokens.resize(n);
  r.logprobs.resize(n);
  const uint8_t* body = p + kRolloutHeaderBytes;
  for (uint32_t i = 0; i < n; ++i) {
    r.tokens[i] = load_le32(body + 4 * i);
    if (limits.vocab_size != 0 && r.tokens[i] >= limits.vocab_size) {
      fail("rollout: token {} is id {} (allowed: below the vocabulary size {})", i, r.tokens[i],
           limits.vocab_size);
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    r.logprobs[i] = bits_to_float(load_le32(body + 4 * n + 4 * i));
    if (!std::isfinite(r.logprobs[i]) || r.logprobs[i] > 0 || r.logprobs[i] < limits.min_logprob) {
      fail("rollout: log-probability {} is {} (allowed: finite, <= 0 and >= {})", i,
           r.logprobs[i], limits.min_logprob);
    }
  }
  return r;
}

std::string rollout_signing_bytes(std::string_view run_id, std::string_view rollout_bytes) {
  if (run_id.size() > 0xFFFF) fail("rl run id of {} bytes is too long (allowed: <= 65535)", run_id.size());
  std::string out = "agora/rollout/v1";
  uint8_t len[2];
  store_le16(static_cast<uint16_t>(run_id.size()), len);
  out.append(reinterpret_cast<const char*>(len), 2);
  out.append(run_id);
  out.append(rollout_bytes);
  return out;
}

}  // namespace agora
