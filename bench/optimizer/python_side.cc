#include "python_side.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "agora/core/error.h"
#include "agora/core/file.h"

extern char** environ;

namespace agora::bench {
namespace {

// Runs argv with stdout sent to our stderr (the table stays on stdout); fails unless it exits 0.
void run_command(const std::vector<std::string>& argv) {
  std::cout.flush();
  std::cerr.flush();
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
  if (error != 0) fail("cannot run {}: {}", command, std::strerror(error));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail("waitpid for {}: {}", command, std::strerror(errno));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail("the Python reference failed ({}; its output is above): {}",
         WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                           : fmt::format("signal {}", WTERMSIG(status)),
         command);
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
