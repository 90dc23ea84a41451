#include "python_side.h"

#include <unistd.h>

#include <filesystem>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/subprocess.h"

namespace agora::bench {
namespace {

// Runs argv with stdout sent to our stderr (the table stays on stdout); fails unless it exits 0.
void run_command(const std::vector<std::string>& argv) {
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kStderr;
  Subprocess process = Subprocess::start(argv, options);
  const ExitStatus exit = process.wait();
  if (!exit.success()) {
    fail("the Python reference failed ({}; its output is above): {}", exit.describe(),
         process.command());
  }
}

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (const int64_t x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

}  // namespace

PythonFigures run_python(const Options& o, const std::vector<NamedParameter>& params,
                         const DemoConfig& config, const std::vector<int64_t>& peers) {
  namespace fs = std::filesystem;
  const std::string stem = fmt::format("bench_optimizer_{}_{}_{}", ::getpid(), config.topk,
                                       config.one_bit ? "1bit" : "f32");
  const fs::path shapes_file = fs::temp_directory_path() / (stem + "_shapes.json");
  const fs::path report_file = fs::temp_directory_path() / (stem + "_report.json");
  nlohmann::json shapes = nlohmann::json::array();
  for (const NamedParameter& p : params) {
    shapes.push_back({{"name", p.name}, {"shape", p.tensor.sizes().vec()}});
  }
  write_file_atomic(shapes_file, shapes.dump() + "\n");
  std::error_code ignored;
  fs::remove(report_file, ignored);

  PythonFigures out;
  try {
    run_command({o.python,    o.script,
                 "--shapes",  shapes_file.string(),
                 "--topk",    std::to_string(config.topk),
                 "--chunk",   std::to_string(config.chunk),
                 "--one-bit", config.one_bit ? "1" : "0",
                 "--peers",   join(peers),
                 "--repeats", std::to_string(o.repeats),
                 "--threads", std::to_string(o.threads),
                 "--seed",    std::to_string(o.seed),
                 "--json",    report_file.string()});
    out.report = nlohmann::json::parse(read_file(report_file));
    const nlohmann::json& m = out.report.at("median_seconds");
    out.compress = m.at("compress").get<double>();
    out.adamw = m.at("adamw").get<double>();
    for (const int64_t p : peers) {
      out.aggregate[p] = m.at(fmt::format("aggregate_{}", p)).get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    fs::remove(shapes_file, ignored);
    fail("the Python reference's report {} is not what bench_optimizer expects: {}",
         report_file.string(), e.what());
  } catch (...) {
    fs::remove(shapes_file, ignored);
    throw;
  }
  fs::remove(shapes_file, ignored);
  fs::remove(report_file, ignored);
  const int64_t parameters = out.report.value("parameters", int64_t{0});
  int64_t expected = 0;
  for (const NamedParameter& p : params) expected += p.tensor.numel();
  if (parameters != expected) {
    fail("the Python reference timed {} parameters, the model has {}", parameters, expected);
  }
  return out;
}

}  // namespace agora::bench
