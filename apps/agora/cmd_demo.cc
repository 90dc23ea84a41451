// agora demo: a whole decentralized run on this machine. A coordinator and N peers start as
// separate processes talking CURVE-encrypted ZeroMQ over loopback, with fresh keys and an
// allowlist, train on the bundled corpus, and the last checkpoint writes a sample.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/core/subprocess.h"
#include "agora/net/identity.h"
#include "agora/obs/log.h"
#include "agora/obs/progress.h"
#include "cmd_demo_pipeline.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {
namespace fs = std::filesystem;

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail("cannot find a free port on 127.0.0.1: {}", std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// Starts one process of the demo with its stderr (and its stdout, unless piped) appended to
// `log`, in a process group of its own: a Ctrl-C reaches the demo, which stops its children in
// order.
Subprocess start_child(const std::vector<std::string>& argv, const fs::path& log,
                       bool pipe_stdout) {
  SubprocessOptions options;
  options.stdout_to = pipe_stdout ? ChildOutput::kPipe : ChildOutput::kLog;
  options.stderr_to = ChildOutput::kLog;
  options.log = log;
  options.own_process_group = true;
  return Subprocess::start(argv, options);
}

struct DemoArgs {
  int64_t peers = 4;
  int64_t steps = 0;  // 0 = the config's
  std::string config = "configs/network-demo.toml";
  std::string data = "data/tokens/sp8k";
  std::string out = "runs/network-demo";
  std::string prompt = "And God said";
  std::string log_format = "text";  // the children's log lines (in their .log files)
  int64_t pipeline = 0;             // > 0: a pipelined run of this many stage processes
  std::string schedule, codec;      // the pipeline's, when set
};

void run_demo(const DemoArgs& args) {
  obs::configure_logging("demo", obs::parse_log_format(args.log_format));
  const auto& stop = stop_requested();
  const std::string agora = this_executable().string();
  const fs::path out = args.out, keys = out / "keys";
  // Each demo starts afresh; only ever delete a folder that an earlier demo made.
  if (fs::exists(out) && !fs::is_empty(out) && !fs::exists(out / "allowlist.txt")) {
    fail("--out {} exists and is not an earlier demo's folder; choose another (or remove it)",
         out.string());
  }
  fs::remove_all(out);
  fs::create_directories(keys);

  // Fresh identities, and an allowlist naming exactly the demo's peers.
  net::Identity::generate().save(keys / "coordinator.key");
  const net::Identity coordinator = net::Identity::load(keys / "coordinator.key");
  std::ofstream allowlist(out / "allowlist.txt");
  allowlist << "# the demo's peers\n";
  for (int64_t i = 0; i < args.peers; ++i) {
    const net::Identity id = net::Identity::generate();
    id.save(keys / fmt::format("peer-{}.key", i));
    allowlist << net::key_to_hex(id.public_key()) << "\n";
  }
  allowlist.close();

  const std::string endpoint = fmt::format("tcp://127.0.0.1:{}", free_loopback_port());
  const int http_port = free_loopback_port();
  std::vector<std::string> coordinator_argv = {
      agora,
      "coordinator",
      "--config",
      args.config,
      "--key",
      (keys / "coordinator.key").string(),
      "--json",
      "--http",
      fmt::format("127.0.0.1:{}", http_port),
      "--log-format",
      args.log_format,
      "--set",
      "network.listen=\"" + endpoint + "\"",
      "--set",
      "network.allowlist=\"" + (out / "allowlist.txt").string() + "\"",
      "--set",
      "network.state_db=\"" + (out / "coordinator.db").string() + "\"",
      "--set",
      fmt::format("network.min_peers={}", args.peers)};
  std::vector<std::string> overrides;
  if (args.steps > 0) {
    overrides.push_back(fmt::format("train.steps={}", args.steps));
    // A short demo keeps a warmup that fits in it.
    const RunConfig base = RunConfig::load(args.config);
    if (base.schedule.warmup_steps > args.steps) {
      overrides.push_back(fmt::format("schedule.warmup_steps={}", args.steps / 10));
    }
  }
  RunConfig::load(args.config, overrides);  // a bad config fails here, before anything starts
  for (const std::string& o : overrides) {
    coordinator_argv.push_back("--set");
    coordinator_argv.push_back(o);
  }
  fmt::print("agora demo: a coordinator and {} peers on loopback (logs in {})\n", args.peers,
             out.string());
  fmt::print("dashboard: http://127.0.0.1:{}/\n", http_port);
  std::vector<Subprocess> children;
  children.push_back(start_child(coordinator_argv, out / "coordinator.log", true));
  for (int64_t i = 0; i < args.peers; ++i) {
    children.push_back(
        start_child({agora, "peer", "--coordinator", endpoint, "--coordinator-key",
                     net::key_to_hex(coordinator.public_key()), "--key",
                     (keys / fmt::format("peer-{}.key", i)).string(), "--data", args.data,
                     "--listen", "tcp://127.0.0.1:*", "--threads", "1", "--checkpoint-dir",
                     (out / fmt::format("peer-{}", i)).string(), "--log-format", args.log_format},
                    out / fmt::format("peer-{}.log", i), false));
  }
  const auto stop_all = [&] {
    for (auto it = children.rbegin(); it != children.rend(); ++it) it->stop(10);
  };

  fmt::print("{:>6}  {:>8}  {:>5}  {:>10}  {:>12}  {:>14}\n", "step", "loss", "peers", "tokens/s",
             "sent/peer", "all-reduce");
  const auto started = std::chrono::steady_clock::now();
  std::string buffer;
  double first_loss = NAN, last_loss = NAN, bytes_sum = 0, allreduce = 0, tps_sum = 0;
  int64_t rows = 0, rated_rows = 0;
  Subprocess& coord = children[0];
  while (true) {
    if (stop.load()) {
      fmt::print("\nagora demo: stopping every process\n");
      stop_all();
      return;
    }
    pollfd p{coord.stdout_fd(), POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      char chunk[4096];
      const ssize_t n = ::read(coord.stdout_fd(), chunk, sizeof(chunk));
      if (n <= 0) break;  // the coordinator exited
      buffer.append(chunk, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buffer.find('\n')) != std::string::npos) {
        const std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.value("event", "") == "step") {
          // A figure the coordinator does not know yet (the first step's rate) is null.
          const auto number = [&](const char* key) {
            return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
          };
          const double loss = number("loss"), tps = number("tokens_per_second");
          const double payload =
              std::isfinite(number("payload_bytes")) ? number("payload_bytes") : 0.0;
          if (std::isnan(first_loss)) first_loss = loss;
          last_loss = loss;
          bytes_sum += payload;
          if (std::isfinite(number("allreduce_bytes"))) allreduce = number("allreduce_bytes");
          if (std::isfinite(tps)) tps_sum += tps, ++rated_rows;
          ++rows;
          fmt::print("{:>6}  {:>8.4f}  {:>5}  {:>10}  {:>12}  {:>14}\n", j.value("step", 0), loss,
                     j.value("peers", 0), std::isfinite(tps) ? fmt::format("{:.0f}", tps) : "-",
                     format_bytes(payload), format_bytes(allreduce));
          std::fflush(stdout);
        } else if (j.value("event", "") == "log") {
          const std::string text = j.value("text", "");
          if (text.find("joined") != std::string::npos ||
              text.find("dropped") != std::string::npos || text.find("left") != std::string::npos ||
              text.find("finished") != std::string::npos) {
            fmt::print("        | {}\n", text);
          }
        }
      }
    }
  }
  // A coordinator that closed its stdout but is still finishing after 10 s counts as done.
  const std::optional<ExitStatus> coordinator_exit = coord.wait_for(10);
  if (coordinator_exit && !coordinator_exit->success()) {
    stop_all();
    std::ifstream log(out / "coordinator.log");
    fail("the coordinator stopped with an error:\n{}",
         std::string(std::istreambuf_iterator<char>(log), {}));
  }
  for (size_t i = 1; i < children.size(); ++i) {
    if (!children[i].wait_for(60)) children[i].stop(5);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (rows == 0) {
    fail("the run finalized no step; see {}/coordinator.log and the peer logs", out.string());
  }
  fmt::print("\nagora demo: {} steps in {} with {} peers; loss {:.3f} -> {:.3f}\n", rows,
             format_duration(seconds), args.peers, first_loss, last_loss);
  fmt::print(
      "  mean {:.0f} tokens/s; each peer sent {} per step where an fp32 all-reduce sends "
      "{} ({:.0f}x less)\n",
      rated_rows > 0 ? tps_sum / static_cast<double>(rated_rows) : 0.0,
      format_bytes(bytes_sum / rows), format_bytes(allreduce),
      bytes_sum > 0 ? allreduce / (bytes_sum / rows) : 0.0);
  fs::path checkpoint;
  for (int64_t i = 0; i < args.peers; ++i) {
    const fs::path latest = out / fmt::format("peer-{}", i) / "latest";
    if (fs::exists(latest)) checkpoint = fs::canonical(latest);
  }
  if (checkpoint.empty()) fail("no peer wrote a checkpoint; see the peer logs in {}", out.string());
  fmt::print("  checkpoint {}\n\nsample (\"{}\"):\n", checkpoint.string(), args.prompt);
  std::fflush(stdout);
  Subprocess sample = start_child({agora, "generate", "--checkpoint", checkpoint.string(),
                                   "--prompt", args.prompt, "--tokens", "40", "--seed", "1"},
                                  out / "generate.log", false);
  sample.wait_for(120);
  std::ifstream log(out / "generate.log");
  fmt::print("{}\n", std::string(std::istreambuf_iterator<char>(log), {}));
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "demo", "Run a decentralized training run on this machine: a coordinator and N peers");
  cmd->add_option("--peers", args->peers, "Peers to start")->check(CLI::Range(1, 64));
  cmd->add_option("--steps", args->steps, "Steps (default: the config's train.steps)");
  cmd->add_option("--config", args->config, "Run config with a [network] section");
  cmd->add_option("--data", args->data, "Token folder the peers train on");
  cmd->add_option("--out", args->out, "Folder for keys, logs, the database and checkpoints");
  cmd->add_option("--prompt", args->prompt, "Prompt for the closing sample");
  cmd->add_option("--log-format", args->log_format,
                  "The coordinator's and peers' log lines (in --out): text or json")
      ->capture_default_str();
  cmd->add_option("--pipeline", args->pipeline,
                  "Run a pipelined run instead: this many stage processes, each holding part of "
                  "the model (default config configs/pipeline.toml)")
      ->check(CLI::Range(2, 64));
  cmd->add_option("--schedule", args->schedule, "With --pipeline: gpipe or async");
  cmd->add_option("--codec", args->codec,
                  "With --pipeline: float32, bfloat16, int8 (subspace needs --config with a rank)");
  auto* config_option = cmd->get_option("--config");
  auto* out_option = cmd->get_option("--out");
  cmd->callback([args, config_option, out_option] {
    if (args->pipeline == 0) return run_demo(*args);
    PipelineDemoArgs p;
    p.stages = args->pipeline;
    p.steps = args->steps;
    if (config_option->count() > 0) p.config = args->config;
    if (out_option->count() > 0) p.out = args->out;
    p.data = args->data;
    p.schedule = args->schedule;
    p.codec = args->codec;
    p.prompt = args->prompt;
    run_pipeline_demo(p);
  });
}

}  // namespace agora::cli
