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

namespace {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

std::optional<std::string> NormGuard::check(double norm, double theta_norm, int64_t steps) const {
  if (!std::isfinite(norm))
    return std::string("the pseudo-gradient holds a value that is not finite");
  if (norm == 0) return std::string("the pseudo-gradient is all zeros: it trains nothing");
  if (norm > options_.max_relative * theta_norm) {
    return fmt::format("||D|| = {:.4g} is larger than {:g} x ||theta|| = {:.4g}", norm,
                       options_.max_relative, options_.max_relative * theta_norm);
  }
  if (by_worker_.size() >= options_.min_workers) {
    const double per_step = norm / static_cast<double>(std::max<int64_t>(1, steps));
    const double m = median();
    if (per_step > options_.max_ratio * m) {
      return fmt::format(
          "||D|| per inner step = {:.4g} is more than {:g} x the median over {} workers of their "
          "recent deliveries ({:.4g})",
          per_step, options_.max_ratio, by_worker_.size(), m);
    }
    if (per_step * options_.max_ratio < m) {
      return fmt::format(
          "||D|| per inner step = {:.4g} is less than 1/{:g} of the median over {} workers of "
          "their recent deliveries ({:.4g}): it trains next to nothing",
          per_step, options_.max_ratio, by_worker_.size(), m);
    }
  }
  return std::nullopt;
}

void NormGuard::accept(const std::string& worker, double norm, int64_t steps) {
  Kept& kept = by_worker_[worker];
  kept.per_step.push_back(norm / static_cast<double>(std::max<int64_t>(1, steps)));
  while (kept.per_step.size() > std::max<size_t>(1, options_.per_worker)) kept.per_step.pop_front();
  kept.last = ++accepted_;
  while (by_worker_.size() > std::max<size_t>(1, options_.max_workers)) {
    auto oldest = by_worker_.begin();
    for (auto it = by_worker_.begin(); it != by_worker_.end(); ++it) {
      if (it->second.last < oldest->second.last) oldest = it;
    }
    by_worker_.erase(oldest);
  }
}

double NormGuard::median() const {
  std::vector<double> medians;
  for (const auto& [worker, kept] : by_worker_) {
    medians.push_back(median_of({kept.per_step.begin(), kept.per_step.end()}));
  }
  return median_of(std::move(medians));
}

std::map<std::string, std::vector<double>> NormGuard::recent() const {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [worker, kept] : by_worker_) {
    out[worker].assign(kept.per_step.begin(), kept.per_step.end());
  }
  return out;
}

void NormGuard::restore(const std::map<std::string, std::vector<double>>& recent) {
  by_worker_.clear();
  accepted_ = 0;
  for (const auto& [worker, values] : recent) {
    for (double v : values) accept(worker, v, 1);
  }
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

std::optional<std::string> too_soon(double seconds_per_step, std::vector<double> others,
                                    double max_speedup) {
  if (others.size() < 2) return std::nullopt;
  const double median = median_of(std::move(others));
  if (seconds_per_step * max_speedup >= median) return std::nullopt;
  return fmt::format(
      "back after {:.4g} s per inner step, more than {:g} x faster than the median worker's "
      "{:.4g} s: nothing was trained in that time",
      seconds_per_step, max_speedup, median);
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

double dylu_reference_seconds(std::vector<double> seconds_per_step, double max_speedup) {
  if (seconds_per_step.empty()) return 0;
  const double median = median_of(seconds_per_step);
  double fastest = median;
  for (double s : seconds_per_step) {
    if (s >= median / max_speedup) fastest = std::min(fastest, s);
  }
  return fastest;
}

}  // namespace agora
