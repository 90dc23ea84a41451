// Metrics: a small registry that speaks Prometheus' text exposition format (version 0.0.4).
//
// Debian has no C++ Prometheus client, and the format is small: a registry of metric families
// (counter, gauge, histogram), each with a HELP and TYPE line and one series per label set.
// Every agora process that serves /metrics owns one Registry; the code that knows a value
// updates it (a counter's inc(), a histogram's observe()), or a collector callback sets it at
// scrape time from state kept elsewhere (the coordinator publishes its RunState that way, with
// no bookkeeping of its own).
//
// What it promises:
//   - every method is thread-safe; a Counter&, Gauge& or Histogram& stays valid as long as the
//     registry, so hot paths look a series up once and then only touch an atomic or a mutex;
//   - render() writes families sorted by name and series sorted by label values, so the output
//     is deterministic (tests compare it verbatim); label values and HELP text are escaped as
//     the format requires (\\, \", \n), and values print as Go does: NaN, +Inf, -Inf;
//   - histograms write cumulative _bucket{le="..."} series ending with le="+Inf", then _sum
//     and _count;
//   - a name or label name that Prometheus would refuse, a label named "le" on a histogram, or
//     one name registered with two types or two bucket layouts is a programming error: Error.
//
// The catalogue of what agora exports is in obs/metrics_catalogue.h.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace agora::obs {

// Label name -> value pairs. Order does not matter: series are keyed by the sorted set.
using Labels = std::vector<std::pair<std::string, std::string>>;

// Only goes up (or is set from a count kept elsewhere that only goes up).
class Counter {
 public:
  void inc(double by = 1.0) { value_.fetch_add(by, std::memory_order_relaxed); }
  // For collectors mirroring a monotonic count owned by someone else (the coordinator's
  // RunState counters). A decrease reads to Prometheus as a process restart.
  void set_total(double total) { value_.store(total, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), the last one for +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Buckets for durations in seconds, 5 ms to 10 minutes: one layout for payload fetches, rounds,
// checkpoints and whole state fetches, so that a family never mixes layouts.
std::vector<double> seconds_buckets();

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of family `name` with `labels`, created (with its family) on first use. `help`
  // is taken from the first call for a name.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                       const Labels& labels = {});

  // Runs before every render(), on the scraping thread, in the order added; it sets values
  // through the methods above. It must not call render() or add_collector().
  void add_collector(std::function<void(Registry&)> collector);

  // Runs the collectors, then writes every family in the text format.
  std::string render();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family;
  Family& family(std::string_view name, std::string_view help, Type type,
                 const std::vector<double>* bounds);

  std::mutex mutex_;  // guards families_ (the series inside have their own atomics or mutex)
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
  std::mutex collectors_mutex_;  // held across a scrape: one scrape runs collectors at a time
  std::vector<std::function<void(Registry&)>> collectors_;
};

// The standard process_* metrics, read from /proc/self at scrape time:
// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds, process_open_fds.
void add_process_metrics(Registry& registry);

// The exposition format's content type, for the HTTP response.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// For the format's rules (exposed for tests): a label value or HELP text escaped, and a value
// written as Prometheus reads it.
std::string escape_label_value(std::string_view value);
std::string escape_help(std::string_view help);
std::string format_value(double value);

}  // namespace agora::obs
