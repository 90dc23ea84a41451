// agora demo --pipeline S: a pipelined run on this machine (docs/pipeline.md). S `agora stage`
// processes, each holding its part of the model, pass activations and gradients to their
// neighbours over CURVE-encrypted ZeroMQ on loopback; a live table follows the last stage; at
// the end the stages' files are merged into one checkpoint and it writes a sample.
#include "cmd_demo_pipeline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/core/subprocess.h"
#include "agora/net/identity.h"
#include "agora/obs/progress.h"
#include "signals.h"

namespace agora::cli {
namespace fs = std::filesystem;
namespace {

Subprocess start_logged(const std::vector<std::string>& argv, const fs::path& log) {
  SubprocessOptions options;
  options.stdout_to = ChildOutput::kLog;
  options.stderr_to = ChildOutput::kLog;
  options.log = log;
  options.own_process_group = true;
  return Subprocess::start(argv, options);
}

// The JSON lines appended to a file since the last call.
class Tail {
 public:
  explicit Tail(fs::path path) : path_(std::move(path)) {}
  std::vector<nlohmann::json> next() {
    std::vector<nlohmann::json> out;
    std::ifstream in(path_);
    if (!in) return out;
    in.seekg(offset_);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written
      offset_ += static_cast<std::streamoff>(line.size() + 1);
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) out.push_back(std::move(j));
    }
    return out;
  }

 private:
  fs::path path_;
  std::streamoff offset_ = 0;
};

}  // namespace

void run_pipeline_demo(const PipelineDemoArgs& args) {
  const auto& stop = stop_requested();
  const std::string agora = this_executable().string();
  const fs::path out = args.out, keys = out / "keys";
  if (fs::exists(out) && !fs::is_empty(out) && !fs::exists(out / "pipeline-demo")) {
    fail(
        "--out {} exists and is not an earlier pipeline demo's folder; choose another (or "
        "remove it)",
        out.string());
  }
  fs::remove_all(out);
  fs::create_directories(keys);
  std::ofstream(out / "pipeline-demo") << "agora demo --pipeline\n";

  const int64_t S = args.stages;
  std::vector<std::string> overrides = {fmt::format("pipeline.stages={}", S),
                                        fmt::format("data.dir={}", args.data), "train.threads=1"};
  if (args.steps > 0) {
    overrides.push_back(fmt::format("train.steps={}", args.steps));
    const RunConfig base = RunConfig::load(args.config);
    if (base.schedule.warmup_steps > args.steps) {
      overrides.push_back(fmt::format("schedule.warmup_steps={}", args.steps / 10));
    }
  }
  if (!args.schedule.empty()) overrides.push_back("pipeline.schedule=" + args.schedule);
  if (!args.codec.empty()) overrides.push_back("pipeline.codec=" + args.codec);
  const RunConfig config = RunConfig::load(args.config, overrides);  // fails before any start

  std::vector<std::string> public_keys;
  for (int64_t i = 0; i < S; ++i) {
    const net::Identity id = net::Identity::generate();
    id.save(keys / fmt::format("stage-{}.key", i));
    public_keys.push_back(net::key_to_hex(id.public_key()));
  }
  std::vector<int> ports;
  for (int64_t i = 0; i < S; ++i) ports.push_back(free_loopback_port());

  fmt::print(
      "agora demo: a pipeline of {} stage processes on loopback ({} schedule, {} "
      "boundaries; logs in {})\n",
      S, config.pipeline.schedule, config.pipeline.codec, out.string());
  std::vector<Subprocess> stages;
  for (int64_t i = S - 1; i >= 0; --i) {
    std::vector<std::string> argv = {agora,      "stage",
                                     "--config", args.config,
                                     "--stage",  std::to_string(i),
                                     "--key",    (keys / fmt::format("stage-{}.key", i)).string(),
                                     "--events", (out / fmt::format("stage-{}.jsonl", i)).string(),
                                     "--out",    (out / "stages").string()};
    if (i > 0) {
      argv.insert(argv.end(), {"--listen", fmt::format("tcp://127.0.0.1:{}", ports[i]),
                               "--prev-key", public_keys[static_cast<size_t>(i - 1)]});
    }
    if (i < S - 1) {
      argv.insert(argv.end(), {"--next", fmt::format("tcp://127.0.0.1:{}", ports[i + 1]),
                               "--next-key", public_keys[static_cast<size_t>(i + 1)]});
    }
    for (const std::string& o : overrides) argv.insert(argv.end(), {"--set", o});
    stages.push_back(start_logged(argv, out / fmt::format("stage-{}.log", i)));
  }
  std::reverse(stages.begin(), stages.end());  // stages[i] is stage i
  const auto stop_all = [&] {
    for (Subprocess& s : stages) s.stop(5);
  };

  fmt::print("{:>6}  {:>8}  {:>10}  {:>16}  {:>8}\n", "step", "loss", "tokens/s", "boundary sent",
             "ETA");
  Tail last(out / fmt::format("stage-{}.jsonl", S - 1)), first(out / "stage-0.jsonl");
  const auto started = std::chrono::steady_clock::now();
  int64_t tokens_per_step = 0, steps = 0;
  double previous = 0, first_loss = NAN, last_loss = NAN;
  uint64_t sent = 0;
  while (true) {
    if (stop.load()) {
      fmt::print("\nagora demo: stopping every stage\n");
      stop_all();
      return;
    }
    for (const auto& e : first.next()) {
      if (e.value("event", "") == "step") sent = e.value("bytes_sent", uint64_t{0});
    }
    for (const auto& e : last.next()) {
      const std::string kind = e.value("event", "");
      if (kind == "start") tokens_per_step = e.value("tokens_per_step", int64_t{0});
      if (kind != "step") continue;
      const double elapsed = e.value("elapsed", 0.0), loss = e.value("loss", 0.0);
      const int64_t step = e.value("step", int64_t{0}) + 1;
      if (std::isnan(first_loss)) first_loss = loss;
      last_loss = loss;
      steps = step;
      const double rate = static_cast<double>(tokens_per_step) / std::max(elapsed - previous, 1e-9);
      previous = elapsed;
      const double eta =
          elapsed / static_cast<double>(step) * static_cast<double>(config.train.steps - step);
      fmt::print("{:>6}  {:>8.4f}  {:>10.0f}  {:>16}  {:>8}\n", step, loss, rate,
                 format_bytes(static_cast<double>(sent)), format_duration(eta));
      std::fflush(stdout);
    }
    bool running = false;
    for (Subprocess& s : stages) {
      if (s.pid() < 0) continue;
      const auto status = s.wait_for(0);
      if (!status) {
        running = true;
      } else if (!status->success()) {
        stop_all();
        std::ifstream log(out / fmt::format("stage-{}.log", &s - stages.data()));
        fail("stage {} stopped with an error:\n{}", &s - stages.data(),
             std::string(std::istreambuf_iterator<char>(log), {}));
      }
    }
    if (!running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (const auto& e : last.next()) {
    if (e.value("event", "") == "step") last_loss = e.value("loss", last_loss);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  fmt::print("\nagora demo: {} steps through {} stage processes in {}; loss {:.3f} -> {:.3f}\n",
             steps, S, format_duration(seconds), first_loss, last_loss);
  const fs::path checkpoint = out / "checkpoint";
  std::vector<std::string> merge = {agora,       "merge-stages",     "--config",
                                    args.config, "--stages",         (out / "stages").string(),
                                    "--out",     checkpoint.string()};
  for (const std::string& o : overrides) merge.insert(merge.end(), {"--set", o});
  if (!start_logged(merge, out / "merge.log").wait().success()) {
    fail("merging the stage files failed; see {}", (out / "merge.log").string());
  }
  fmt::print("  stage files merged into one checkpoint: {}\n\nsample (\"{}\"):\n",
             checkpoint.string(), args.prompt);
  std::fflush(stdout);
  start_logged({agora, "generate", "--checkpoint", checkpoint.string(), "--prompt", args.prompt,
                "--tokens", "40", "--seed", "1"},
               out / "generate.log")
      .wait();
  std::ifstream log(out / "generate.log");
  fmt::print("{}\n", std::string(std::istreambuf_iterator<char>(log), {}));
}

}  // namespace agora::cli
