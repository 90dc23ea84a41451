#include "agora/net/link_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "agora/core/error.h"

namespace agora::net {
namespace {

constexpr double kMaxDelaySeconds = 3600;    // keeps every time_point sum far from overflow
constexpr double kMinRateBitsPerSecond = 8;  // one byte a second; slower waits look like hangs

void check_seconds(const char* field, double value) {
  if (!(std::isfinite(value) && value >= 0 && value <= kMaxDelaySeconds))
    fail("link profile: {} is {}; allowed: 0 to {} seconds", field, value, kMaxDelaySeconds);
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

// Splits "20mbit" into 20 and "mbit". Throws when no number leads or it is negative or not finite.
std::pair<double, std::string> split_number(std::string_view spec, std::string_view part,
                                            std::string_view value, const char* allowed) {
  double number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || !std::isfinite(number) || number < 0)
    fail("link profile \"{}\": \"{}\" needs a non-negative number first; allowed: {}", spec, part,
         allowed);
  return {number, lower(trim(std::string_view(end, value.data() + value.size() - end)))};
}

double parse_rate(std::string_view spec, std::string_view part, std::string_view value) {
  constexpr const char* allowed =
      "a number and bit, kbit, mbit or gbit (per second, \"/s\" optional), 0 or unlimited, e.g. "
      "rate=20mbit";
  if (lower(value) == "unlimited") return 0;
  auto [number, unit] = split_number(spec, part, value, allowed);
  if (unit.ends_with("/s")) unit.resize(unit.size() - 2);
  if (unit.empty() && number == 0) return 0;
  if (unit.empty())
    fail("link profile \"{}\": \"{}\" needs a unit; allowed: {}", spec, part, allowed);
  if (unit == "bit") return number;
  if (unit == "kbit") return number * 1e3;
  if (unit == "mbit") return number * 1e6;
  if (unit == "gbit") return number * 1e9;
  fail("link profile \"{}\": \"{}\" has unit \"{}\"; allowed: {}", spec, part, unit, allowed);
}

double parse_seconds(std::string_view spec, std::string_view part, std::string_view value) {
  constexpr const char* allowed = "a number and s, ms or us, e.g. delay=50ms";
  const auto [number, unit] = split_number(spec, part, value, allowed);
  if (unit.empty() && number == 0) return 0;
  if (unit.empty())
    fail("link profile \"{}\": \"{}\" needs a unit; allowed: {}", spec, part, allowed);
  if (unit == "s") return number;
  if (unit == "ms") return number * 1e-3;
  if (unit == "us") return number * 1e-6;
  fail("link profile \"{}\": \"{}\" has unit \"{}\"; allowed: {}", spec, part, unit, allowed);
}

double parse_loss(std::string_view spec, std::string_view part, std::string_view value) {
  constexpr const char* allowed =
      "a percentage below 100% (loss=1%) or a fraction below 1 (loss=0.01)";
  const auto [number, unit] = split_number(spec, part, value, allowed);
  double loss = number;
  if (unit == "%")
    loss = number / 100;
  else if (!unit.empty())
    fail("link profile \"{}\": \"{}\" has unit \"{}\"; allowed: {}", spec, part, unit, allowed);
  if (loss >= 1)
    fail("link profile \"{}\": \"{}\" is not below 100%; allowed: {}", spec, part, allowed);
  return loss;
}

uint64_t parse_seed(std::string_view spec, std::string_view part, std::string_view value) {
  uint64_t seed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seed);
  if (error != std::errc() || end != value.data() + value.size())
    fail("link profile \"{}\": \"{}\" is not an unsigned 64-bit integer, e.g. seed=7", spec, part);
  return seed;
}

}  // namespace

void validate(const LinkProfile& p) {
  if (!(p.bandwidth_bits_per_second == 0 || (std::isfinite(p.bandwidth_bits_per_second) &&
                                             p.bandwidth_bits_per_second >= kMinRateBitsPerSecond)))
    fail(
        "link profile: bandwidth_bits_per_second is {}; allowed: 0 (unlimited) or {} and up, "
        "finite",
        p.bandwidth_bits_per_second, kMinRateBitsPerSecond);
  check_seconds("delay_seconds", p.delay_seconds);
  check_seconds("jitter_seconds", p.jitter_seconds);
  if (!(p.loss >= 0 && p.loss < 1))  // false for NaN too
    fail("link profile: loss is {}; allowed: 0 <= loss < 1 (a probability: 1% is 0.01)", p.loss);
}

LinkProfile parse_link_profile(std::string_view spec) {
  LinkProfile profile;
  const std::string_view whole = trim(spec);
  if (whole.empty() || lower(whole) == "none") return profile;
  std::vector<std::string> seen;
  std::string_view rest = whole;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view part = trim(rest.substr(0, comma));
    const size_t equals = part.find('=');
    if (equals == std::string_view::npos)
      fail("link profile \"{}\": \"{}\" is not key=value; keys: rate, delay, jitter, loss, seed",
           spec, part);
    const std::string key = lower(trim(part.substr(0, equals)));
    const std::string_view value = trim(part.substr(equals + 1));
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      fail("link profile \"{}\": \"{}\" is given twice; give each key at most once", spec, key);
    seen.push_back(key);
    if (key == "rate")
      profile.bandwidth_bits_per_second = parse_rate(spec, part, value);
    else if (key == "delay")
      profile.delay_seconds = parse_seconds(spec, part, value);
    else if (key == "jitter")
      profile.jitter_seconds = parse_seconds(spec, part, value);
    else if (key == "loss")
      profile.loss = parse_loss(spec, part, value);
    else if (key == "seed")
      profile.seed = parse_seed(spec, part, value);
    else
      fail("link profile \"{}\": unknown key \"{}\"; keys: rate, delay, jitter, loss, seed", spec,
           key);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  try {
    validate(profile);
  } catch (const Error& e) {
    fail("link profile \"{}\": {}", spec, e.what());
  }
  return profile;
}

std::string to_string(const LinkProfile& p) {
  std::vector<std::string> parts;
  const double rate = p.bandwidth_bits_per_second;
  if (rate >= 1e9)
    parts.push_back(fmt::format("rate={:g}gbit", rate / 1e9));
  else if (rate >= 1e6)
    parts.push_back(fmt::format("rate={:g}mbit", rate / 1e6));
  else if (rate >= 1e3)
    parts.push_back(fmt::format("rate={:g}kbit", rate / 1e3));
  else if (rate > 0)
    parts.push_back(fmt::format("rate={:g}bit", rate));
  const auto seconds = [](double s) {
    if (s >= 1) return fmt::format("{:g}s", s);
    if (s >= 1e-3) return fmt::format("{:g}ms", s * 1e3);
    return fmt::format("{:g}us", s * 1e6);
  };
  if (p.delay_seconds > 0) parts.push_back("delay=" + seconds(p.delay_seconds));
  if (p.jitter_seconds > 0) parts.push_back("jitter=" + seconds(p.jitter_seconds));
  if (p.loss > 0) parts.push_back(fmt::format("loss={:g}%", p.loss * 100));
  if (p.seed != 0) parts.push_back(fmt::format("seed={}", p.seed));
  if (parts.empty()) return "none";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += "," + parts[i];
  return out;
}

}  // namespace agora::net
