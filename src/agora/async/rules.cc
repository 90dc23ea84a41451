#include "agora/async/rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/little_endian.h"

namespace agora {

std::string delivery_signing_bytes(std::string_view run_id, uint64_t work_id,
                                   std::string_view payload) {
  if (run_id.size() > 0xFFFF) {
    fail("async run id of {} bytes is too long (allowed: <= 65535)", run_id.size());
  }
  std::string out = "agora/async-delivery/v1";
  uint8_t len[2];
  store_le16(static_cast<uint16_t>(run_id.size()), len);
  out.append(reinterpret_cast<const char*>(len), 2);
  out.append(run_id);
  uint8_t id[8];
  store_le64(work_id, id);
  out.append(reinterpret_cast<const char*>(id), 8);
  out.append(blake2b256_bytes(payload));
  return out;
}

bool strikes(std::string_view verdict) {
  return verdict != kAccepted && verdict != kStale;
}

std::optional<std::string> NormGuard::check(double norm, double theta_norm, int64_t steps) const {
  if (!std::isfinite(norm))
    return std::string("the pseudo-gradient holds a value that is not finite");
  if (norm > options_.max_relative * theta_norm) {
    return fmt::format("||D|| = {:.4g} is larger than {:g} x ||theta|| = {:.4g}", norm,
                       options_.max_relative, options_.max_relative * theta_norm);
  }
  if (recent_.size() >= options_.min_history) {
    const double per_step = norm / static_cast<double>(std::max<int64_t>(1, steps));
    const double bound = options_.max_ratio * median();
    if (per_step > bound) {
      return fmt::format(
          "||D|| per inner step = {:.4g} is more than {:g} x the median of the last {} accepted "
          "({:.4g})",
          per_step, options_.max_ratio, recent_.size(), median());
    }
  }
  return std::nullopt;
}

void NormGuard::accept(double norm, int64_t steps) {
  recent_.push_back(norm / static_cast<double>(std::max<int64_t>(1, steps)));
  while (recent_.size() > options_.window) recent_.pop_front();
}

double NormGuard::median() const {
  if (recent_.empty()) return 0;
  std::vector<double> sorted(recent_.begin(), recent_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

void PaceEstimate::add(double seconds_per_step) {
  constexpr double kAlpha = 0.3;
  average_ = (1 - kAlpha) * average_ + kAlpha * seconds_per_step;
  weight_ = (1 - kAlpha) * weight_ + kAlpha;
  ++n_;
}

double PaceEstimate::seconds_per_step() const {
  return weight_ > 0 ? average_ / weight_ : 0;
}

int64_t dylu_inner_steps(double seconds_per_step, double fastest_seconds_per_step, int64_t H) {
  if (!(seconds_per_step > 0) || !(fastest_seconds_per_step > 0) || H < 1) {
    fail("DyLU needs positive step times and H >= 1 (got {} s, fastest {} s, H = {})",
         seconds_per_step, fastest_seconds_per_step, H);
  }
  const double ratio = fastest_seconds_per_step / seconds_per_step;
  const auto steps = static_cast<int64_t>(std::floor(ratio * static_cast<double>(H)));
  return std::clamp<int64_t>(steps, 1, H);
}

}  // namespace agora
