// Fuzzes RunConfig::parse: any text must be accepted or rejected with an Error, never crash, and an
// accepted config must survive the round trip through to_toml() unchanged.
//
// The input is TOML text, optionally followed by NUL-separated "--set" overrides (a NUL cannot
// occur in TOML, so the split is unambiguous): "seed = 1\0train.steps=5\0model.preset=tiny". An
// accepted config's learning-rate schedule is also evaluated at its boundaries, where the
// arithmetic (division by the warmup or decay length) could go wrong.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/core/error.h"

namespace {

[[noreturn]] void bug(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_schedule(const agora::RunConfig& config) {
  const int64_t steps = config.train.steps, warmup = config.schedule.warmup_steps;
  for (int64_t step : {int64_t{0}, warmup - 1, warmup, steps / 2, steps - 1, steps, steps + 1}) {
    if (step < 0) continue;
    const double lr = config.learning_rate(step);
    // Never above the peak, never negative, never NaN (the 1e-12 covers cosine's rounding).
    if (!(lr >= 0 && lr <= config.optimizer.lr * (1 + 1e-12))) {
      bug("learning rate out of [0, lr]", config.to_toml() + "step " + std::to_string(step));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (true) {
      const size_t next = rest.find('\0');
      overrides.emplace_back(rest.substr(0, next));
      if (next == std::string_view::npos) break;
      rest.remove_prefix(next + 1);
    }
  }

  agora::RunConfig config;
  try {
    config = agora::RunConfig::parse(text, "<fuzz>", overrides);
  } catch (const agora::Error&) {
    return 0;  // rejected with a message: fine
  }

  const std::string written = config.to_toml();
  agora::RunConfig again;
  try {
    again = agora::RunConfig::parse(written, "<to_toml>", {});
  } catch (const agora::Error& error) {
    bug(error.what(), written);
  }
  if (!(again == config)) bug("parse(to_toml()) differs from the original", written);
  if (again.to_toml() != written) bug("to_toml() is not stable", written);
  check_schedule(config);
  return 0;
}
