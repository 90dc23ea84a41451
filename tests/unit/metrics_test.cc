// The Prometheus registry: the exact text it writes for a counter, a labelled gauge and a
// histogram, escaping, collectors, and the process metrics.
#include "agora/obs/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "agora/core/error.h"
#include "agora/obs/metrics_catalogue.h"

namespace agora::obs {
namespace {

TEST(Metrics, ExactText) {
  Registry r;
  r.counter("jobs_total", "Jobs done.").inc(3);
  r.gauge("temperature_celsius", "Room temperature.", {{"room", "b"}}).set(21.5);
  r.gauge("temperature_celsius", "ignored: the first help stays", {{"room", "a"}}).set(-4);
  Histogram& h = r.histogram("latency_seconds", "Latency.", {0.1, 1}, {{"kind", "x"}});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  EXPECT_EQ(r.render(),
            "# HELP jobs_total Jobs done.\n"
            "# TYPE jobs_total counter\n"
            "jobs_total 3\n"
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{kind=\"x\",le=\"0.1\"} 2\n"
            "latency_seconds_bucket{kind=\"x\",le=\"1\"} 3\n"
            "latency_seconds_bucket{kind=\"x\",le=\"+Inf\"} 4\n"
            "latency_seconds_sum{kind=\"x\"} 7.65\n"
            "latency_seconds_count{kind=\"x\"} 4\n"
            "# HELP temperature_celsius Room temperature.\n"
            "# TYPE temperature_celsius gauge\n"
            "temperature_celsius{room=\"a\"} -4\n"
            "temperature_celsius{room=\"b\"} 21.5\n");
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  Registry r;
  r.gauge("g", "a \\ back\nslash", {{"path", "C:\\dir \"q\"\nnext"}}).set(1);
  EXPECT_EQ(r.render(),
            "# HELP g a \\\\ back\\nslash\n"
            "# TYPE g gauge\n"
            "g{path=\"C:\\\\dir \\\"q\\\"\\nnext\"} 1\n");
}

TEST(Metrics, LabelOrderDoesNotMatter) {
  Registry r;
  r.counter("c_total", "c", {{"b", "2"}, {"a", "1"}}).inc();
  r.counter("c_total", "c", {{"a", "1"}, {"b", "2"}}).inc();
  EXPECT_NE(r.render().find("c_total{a=\"1\",b=\"2\"} 2\n"), std::string::npos);
}

TEST(Metrics, Values) {
  EXPECT_EQ(format_value(NAN), "NaN");
  EXPECT_EQ(format_value(INFINITY), "+Inf");
  EXPECT_EQ(format_value(-INFINITY), "-Inf");
  EXPECT_EQ(format_value(12345678901.0), "12345678901");
  EXPECT_EQ(format_value(0.25), "0.25");
  EXPECT_EQ(format_value(1e300), "1e+300");
}

TEST(Metrics, RefusesBadNamesAndMixedTypes) {
  Registry r;
  EXPECT_THROW(r.counter("1abc", "x"), Error);
  EXPECT_THROW(r.counter("a-b", "x"), Error);
  EXPECT_THROW(r.gauge("ok", "x", {{"bad-label", "v"}}), Error);
  EXPECT_THROW(r.gauge("ok", "x", {{"__reserved", "v"}}), Error);
  EXPECT_THROW(r.histogram("h", "x", {1}, {{"le", "1"}}), Error);
  EXPECT_THROW(r.histogram("h2", "x", {2, 1}), Error);
  r.counter("name_total", "x");
  EXPECT_THROW(r.gauge("name_total", "x"), Error);
  r.histogram("h3", "x", {1, 2});
  EXPECT_THROW(r.histogram("h3", "x", {1, 3}), Error);
}

TEST(Metrics, CollectorsRunAtScrape) {
  Registry r;
  int scrapes = 0;
  r.add_collector([&](Registry& reg) { reg.gauge("scrapes", "Scrapes.").set(++scrapes); });
  EXPECT_NE(r.render().find("scrapes 1\n"), std::string::npos);
  EXPECT_NE(r.render().find("scrapes 2\n"), std::string::npos);
}

TEST(Metrics, ConcurrentIncrementsAreCounted) {
  Registry r;
  Counter& c = counter(r, metric::kPeerRounds);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.inc();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
}

TEST(Metrics, ProcessMetrics) {
  Registry r;
  add_process_metrics(r);
  const std::string text = r.render();
  for (const char* name : {"process_cpu_seconds_total ", "process_resident_memory_bytes ",
                           "process_start_time_seconds ", "process_open_fds "}) {
    EXPECT_NE(text.find(std::string("\n") + name), std::string::npos) << name << "\n" << text;
  }
  const auto at = text.find("\nprocess_start_time_seconds ");
  const double start = std::stod(text.substr(at + 28));
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(start, now - 3600);
  EXPECT_LE(start, now + 1);
}

}  // namespace
}  // namespace agora::obs
