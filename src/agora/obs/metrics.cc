#include "agora/obs/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agora/core/clock.h"
#include "agora/core/error.h"

namespace agora::obs {
namespace {

bool valid_name(std::string_view name, bool colon_allowed) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_allowed && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

// Series are keyed by their labels sorted by name, so {a,b} and {b,a} are one series.
Labels sorted(Labels labels) {
  std::sort(labels.begin(), labels.end());
  return labels;
}

std::string label_text(const Labels& labels, std::string_view extra_name = {},
                       std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += fmt::format("{}=\"{}\"", name, escape_label_value(value));
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += fmt::format("{}=\"{}\"", extra_name, extra_value);
  }
  return out + "}";
}

}  // namespace

// ---- format rules ------------------------------------------------------------------------------

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  for (const char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers (counts, bytes) print without an exponent up to 2^53, where doubles stop being
  // exact anyway; everything else in the shortest form that reads back the same.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return fmt::format("{}", static_cast<int64_t>(value));
  }
  return fmt::format("{}", value);
}

// ---- Histogram ---------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      fail("histogram buckets must be finite and strictly increasing (bucket {} is {})", i,
           bounds_[i]);
    }
  }
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  // Bucket i counts v <= bounds_[i]; the last bucket is +Inf, where NaN goes too (as in the Go
  // client): lower_bound would put it in the first.
  const size_t i = std::isnan(v)
                       ? bounds_.size()
                       : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                             bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (const uint64_t c : counts_) s.cumulative.push_back(running += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> seconds_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

// ---- Registry ----------------------------------------------------------------------------------

struct Registry::Family {
  std::string name, help;
  Type type;
  std::vector<double> bounds;  // histograms
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::family(std::string_view name, std::string_view help, Type type,
                                   const std::vector<double>* bounds) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    if (!valid_name(name, /*colon_allowed=*/true)) {
      fail("'{}' is not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", name);
    }
    auto f = std::make_unique<Family>();
    f->name = name;
    f->help = help;
    f->type = type;
    if (bounds) f->bounds = *bounds;
    it = families_.emplace(std::string(name), std::move(f)).first;
  }
  Family& f = *it->second;
  if (f.type != type) fail("metric {} is registered twice with different types", name);
  if (bounds && f.bounds != *bounds) {
    fail("histogram {} is registered twice with different buckets", name);
  }
  return f;
}

namespace {

void check_labels(std::string_view metric, const Labels& labels, bool histogram) {
  for (const auto& [name, value] : labels) {
    if (!valid_name(name, /*colon_allowed=*/false) || name.starts_with("__")) {
      fail("metric {}: '{}' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)",
           metric, name);
    }
    if (histogram && name == "le") fail("histogram {} may not have a label named le", metric);
  }
}

}  // namespace

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  check_labels(name, labels, false);
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::kCounter, nullptr).counters[sorted(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  check_labels(name, labels, false);
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::kGauge, nullptr).gauges[sorted(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help,
                               std::vector<double> bounds, const Labels& labels) {
  check_labels(name, labels, true);
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::kHistogram, &bounds).histograms[sorted(labels)];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return *slot;
}

void Registry::add_collector(std::function<void(Registry&)> collector) {
  std::lock_guard lock(collectors_mutex_);
  collectors_.push_back(std::move(collector));
}

std::string Registry::render() {
  {
    std::lock_guard lock(collectors_mutex_);
    for (const auto& collect : collectors_) collect(*this);
  }
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    static constexpr const char* kTypes[] = {"counter", "gauge", "histogram"};
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(f->help), name,
                       kTypes[static_cast<int>(f->type)]);
    for (const auto& [labels, c] : f->counters) {
      out += fmt::format("{}{} {}\n", name, label_text(labels), format_value(c->value()));
    }
    for (const auto& [labels, g] : f->gauges) {
      out += fmt::format("{}{} {}\n", name, label_text(labels), format_value(g->value()));
    }
    for (const auto& [labels, h] : f->histograms) {
      const Histogram::Snapshot s = h->snapshot();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
        out += fmt::format("{}_bucket{} {}\n", name, label_text(labels, "le", le), s.cumulative[i]);
      }
      out += fmt::format("{}_sum{} {}\n", name, label_text(labels), format_value(s.sum));
      out += fmt::format("{}_count{} {}\n", name, label_text(labels), s.count);
    }
  }
  return out;
}

// ---- process metrics ---------------------------------------------------------------------------

namespace {

// Fields of /proc/self/stat after the command name (which may contain spaces and parentheses,
// so parsing starts after the last ')'). Field 3 of proc(5) is index 0 here.
std::vector<std::string> self_stat_fields() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(text.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

double boot_time_seconds() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("btime ")) return std::stod(line.substr(6));
  }
  return 0;
}

}  // namespace

void add_process_metrics(Registry& registry) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // The start time never changes: read it once. /proc gives it in ticks since boot.
  const std::vector<std::string> at_start = self_stat_fields();
  double start = 0;
  if (at_start.size() > 19 && ticks > 0)
    start = boot_time_seconds() + std::stod(at_start[19]) / ticks;
  if (start == 0) start = unix_seconds();
  registry.add_collector([ticks, page, start](Registry& r) {
    r.gauge("process_start_time_seconds", "Start time of the process since the Unix epoch.")
        .set(start);
    const std::vector<std::string> f = self_stat_fields();
    // proc(5): utime and stime are fields 14 and 15, vsize 23, rss 24 (in pages).
    if (f.size() > 21 && ticks > 0) {
      r.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")
          .set_total((std::stod(f[11]) + std::stod(f[12])) / ticks);
      r.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")
          .set(std::stod(f[20]));
      r.gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
          .set(std::stod(f[21]) * page);
    }
    std::error_code ec;
    double fds = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++fds;
    }
    r.gauge("process_open_fds", "Number of open file descriptors.").set(fds);
  });
}

}  // namespace agora::obs
