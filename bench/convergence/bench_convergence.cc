// bench_convergence: what DeMo and DiLoCo cost in loss per token, and what they save in bytes,
// against all-reduce AdamW. Every run trains the same model on the same tokens (the bundled
// corpus, N simulated peers, the same global batch and steps); only the strategy differs.
//
// For each run: validation loss every --eval-interval steps, against tokens trained and against
// the bytes one peer sent; the tokens each run needs to reach AdamW's final validation loss
// (linear interpolation between evaluations); bytes per step and the ratio to AdamW's.
// Writes OUT/convergence.csv, OUT/loss_vs_tokens.png and OUT/loss_vs_bytes.png (gnuplot), and
// --json FILE.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/obs/progress.h"
#include "agora/train/trainer.h"

namespace fs = std::filesystem;
using agora::RunConfig;

namespace {

struct Run {
  std::string name;     // a short label for tables, CSV and plots
  std::string summary;  // the setting in words
  std::vector<std::string> overrides;
};

struct Point {
  int64_t step;
  double tokens, bytes, val_loss;
};

struct Result {
  Run run;
  std::vector<Point> curve;
  double bytes_per_step = 0, seconds = 0, final_val = 0;
  std::string hash;
};

// The first token count at which the curve reaches `target`, interpolating linearly between the
// two evaluations around the crossing; nullopt when it never does.
std::optional<double> tokens_to_reach(const std::vector<Point>& curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].val_loss > target) continue;
    if (i == 0) return curve[0].tokens;
    const Point &a = curve[i - 1], &b = curve[i];
    return a.tokens + (b.tokens - a.tokens) * (a.val_loss - target) / (a.val_loss - b.val_loss);
  }
  return std::nullopt;
}

void write_plots(const fs::path& out, const std::vector<Result>& results) {
  std::string script =
      "set terminal pngcairo size 1000,640 font ',11'\n"
      "set datafile separator ','\nset grid\nset key top right\n"
      "set ylabel 'validation loss (nats)'\n";
  const auto plot = [&](const std::string& file, const std::string& xlabel, int column, bool logx) {
    script += fmt::format("set output '{}'\nset xlabel '{}'\n{}\nplot ", (out / file).string(),
                          xlabel, logx ? "set logscale x" : "unset logscale x");
    for (size_t i = 0; i < results.size(); ++i) {
      script += fmt::format("{}'{}' using {}:4 with linespoints title '{}'", i ? ", " : "",
                            (out / ("curve_" + results[i].run.name + ".csv")).string(), column,
                            results[i].run.summary);
    }
    script += "\n";
  };
  plot("loss_vs_tokens.png", "tokens trained (all peers)", 2, false);
  plot("loss_vs_bytes.png", "bytes sent by one peer (log scale)", 3, true);
  agora::write_file_atomic(out / "plots.gp", script);
  const std::string command = fmt::format("gnuplot '{}'", (out / "plots.gp").string());
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "warning: gnuplot failed (is gnuplot-nox installed?); CSV kept\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Validation loss against tokens and bytes: all-reduce AdamW, DeMo, DiLoCo"};
  std::string data = "data/tokens/sp8k", preset = "tiny", out = "out/bench/convergence", json;
  int64_t seq_len = 128, batch = 32, micro = 8, peers = 4, steps = 300, eval_interval = 20;
  int64_t eval_windows = 64, warmup = 30, threads = 0, diloco_h = 10;
  // Each strategy's best of {1e-3, 3e-3, 1e-2, 2e-2 or 3e-2} at these settings (docs/results.md).
  double adamw_lr = 1e-2, demo_lr = 1e-2, demo1_lr = 1e-2, diloco_lr = 1e-2;
  app.add_option("--data", data, "Token folder (agora tokenize)");
  app.add_option("--preset", preset, "Model preset");
  app.add_option("--seq-len", seq_len);
  app.add_option("--batch", batch, "Global batch (sequences per step, all peers)");
  app.add_option("--micro-batch", micro);
  app.add_option("--peers", peers, "Simulated peers");
  app.add_option("--steps", steps);
  app.add_option("--eval-interval", eval_interval);
  app.add_option("--eval-windows", eval_windows);
  app.add_option("--warmup", warmup, "Warmup steps (cosine schedule after)");
  app.add_option("--threads", threads, "0 = every core");
  app.add_option("--adamw-lr", adamw_lr);
  app.add_option("--demo-lr", demo_lr, "DeMo top-k 32");
  app.add_option("--demo1-lr", demo1_lr, "DeMo top-k 4 one-bit");
  app.add_option("--diloco-lr", diloco_lr, "DiLoCo's inner AdamW");
  app.add_option("--diloco-inner-steps", diloco_h);
  std::string only;
  app.add_option("--runs", only,
                 "Comma-separated subset of adamw,demo_top32,demo_top4_1bit,diloco (adamw, the "
                 "reference, always runs)");
  app.add_option("--out", out, "Folder for the CSV and the plots");
  app.add_option("--json", json, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  const auto lr = [](double v) { return fmt::format("optimizer.lr={}", v); };
  std::vector<Run> runs = {
      {"adamw", "all-reduce AdamW (fp32)", {"optimizer.name=adamw", lr(adamw_lr)}},
      {"demo_top32", "DeMo top-k 32 (fp32 values)", {"optimizer.name=demo", lr(demo_lr)}},
      {"demo_top4_1bit",
       "DeMo top-k 4, one-bit",
       {"optimizer.name=demo", "demo.topk=4", "demo.one_bit=true", lr(demo1_lr)}},
      {"diloco",
       fmt::format("DiLoCo H={} (fp32)", diloco_h),
       {"optimizer.name=diloco", fmt::format("diloco.inner_steps={}", diloco_h), lr(diloco_lr)}},
  };

  if (!only.empty()) {
    std::erase_if(runs, [&](const Run& r) {
      return r.name != "adamw" && ("," + only + ",").find("," + r.name + ",") == std::string::npos;
    });
  }

  try {
    fs::create_directories(out);
    std::vector<Result> results;
    for (const Run& run : runs) {
      std::vector<std::string> overrides = {
          "model.preset=" + preset,
          "data.dir=" + data,
          fmt::format("data.seq_len={}", seq_len),
          fmt::format("train.steps={}", steps),
          fmt::format("train.batch_size={}", batch),
          fmt::format("train.micro_batch_size={}", micro),
          fmt::format("train.eval_interval={}", eval_interval),
          fmt::format("train.eval_windows={}", eval_windows),
          fmt::format("train.threads={}", threads),
          "train.out_dir=" + (fs::path(out) / ("run_" + run.name)).string(),
          "schedule.kind=cosine",
          fmt::format("schedule.warmup_steps={}", warmup),
      };
      overrides.insert(overrides.end(), run.overrides.begin(), run.overrides.end());
      const RunConfig config = RunConfig::parse("", "bench_convergence", overrides);
      std::fprintf(stderr, "\n== %s\n", run.summary.c_str());

      std::map<int64_t, double> cumulative_bytes;  // after step s (1-based count)
      double total = 0;
      agora::TrainOptions options;
      options.simulate_peers = peers;
      options.on_step = [&](const agora::StepStats& s) {
        total += static_cast<double>(s.payload_bytes);
        cumulative_bytes[s.step + 1] = total;
      };
      const agora::TrainSummary summary = agora::train(config, options);

      Result r{run, {}, total / steps, summary.seconds, summary.val_loss, summary.parameter_hash};
      std::string csv = "step,tokens,bytes_per_peer,val_loss\n";
      for (const auto& [step, loss] : summary.val_history) {
        const Point p{step, static_cast<double>(step * batch * seq_len), cumulative_bytes[step],
                      loss};
        r.curve.push_back(p);
        csv += fmt::format("{},{},{},{:.6f}\n", p.step, p.tokens, p.bytes, p.val_loss);
      }
      agora::write_file_atomic(fs::path(out) / ("curve_" + run.name + ".csv"), csv);
      results.push_back(std::move(r));
    }

    std::string all = "run,step,tokens,bytes_per_peer,val_loss\n";
    for (const Result& r : results) {
      for (const Point& p : r.curve) {
        all +=
            fmt::format("{},{},{},{},{:.6f}\n", r.run.name, p.step, p.tokens, p.bytes, p.val_loss);
      }
    }
    agora::write_file_atomic(fs::path(out) / "convergence.csv", all);
    write_plots(out, results);

    const Result& adamw = results[0];
    const double target = adamw.final_val;
    const double adamw_tokens = *tokens_to_reach(adamw.curve, target);
    std::printf(
        "\nconvergence: %s, %lld simulated peers, %lld steps x %lld x %lld tokens; target = "
        "AdamW's final val loss %.4f\n\n",
        preset.c_str(), static_cast<long long>(peers), static_cast<long long>(steps),
        static_cast<long long>(batch), static_cast<long long>(seq_len), target);
    std::printf("%-30s %10s %14s %12s %12s %14s %12s %9s\n", "run", "final val", "tokens to tgt",
                "vs AdamW", "AdamW-equal", "bytes/step", "bytes x less", "time");
    nlohmann::json runs_json = nlohmann::json::array();
    for (const Result& r : results) {
      const std::optional<double> tokens = tokens_to_reach(r.curve, target);
      const double token_ratio = tokens ? *tokens / adamw_tokens : NAN;
      const double byte_ratio = adamw.bytes_per_step / r.bytes_per_step;
      // The other way round: when AdamW got to this run's final loss, so a run that never reaches
      // AdamW's still gets a lower bound on the tokens it needs (all of its own, over these).
      const std::optional<double> adamw_equivalent = tokens_to_reach(adamw.curve, r.final_val);
      const double own_tokens = static_cast<double>(steps * batch * seq_len);
      // "AdamW-equal": this run's tokens over AdamW's to the same loss (a lower bound on the
      // token ratio when the run never reaches AdamW's final loss).
      std::printf("%-30s %10.4f %14s %12s %12s %14s %12.0f %9s\n", r.run.summary.c_str(),
                  r.final_val, tokens ? fmt::format("{:.0f}", *tokens).c_str() : "not reached",
                  tokens ? fmt::format("{:.2f}x", token_ratio).c_str() : "-",
                  adamw_equivalent
                      ? fmt::format(">= {:.2f}x", own_tokens / *adamw_equivalent).c_str()
                      : "-",
                  agora::format_bytes(r.bytes_per_step).c_str(), byte_ratio,
                  agora::format_duration(r.seconds).c_str());
      nlohmann::json curve = nlohmann::json::array();
      for (const Point& p : r.curve) {
        curve.push_back({{"step", p.step},
                         {"tokens", p.tokens},
                         {"bytes_per_peer", p.bytes},
                         {"val_loss", p.val_loss}});
      }
      runs_json.push_back(
          {{"name", r.run.name},
           {"setting", r.run.summary},
           {"overrides", r.run.overrides},
           {"final_val_loss", r.final_val},
           {"tokens_to_adamw_final", tokens ? nlohmann::json(*tokens) : nullptr},
           {"tokens_ratio_vs_adamw", tokens ? nlohmann::json(token_ratio) : nullptr},
           {"adamw_tokens_to_this_final",
            adamw_equivalent ? nlohmann::json(*adamw_equivalent) : nullptr},
           {"tokens_ratio_lower_bound",
            adamw_equivalent ? nlohmann::json(own_tokens / *adamw_equivalent) : nullptr},
           {"bytes_per_step_per_peer", r.bytes_per_step},
           {"bytes_ratio_vs_adamw", byte_ratio},
           {"seconds", r.seconds},
           {"parameter_hash", r.hash},
           {"curve", curve}});
    }
    std::printf("\nplots: %s/loss_vs_tokens.png, %s/loss_vs_bytes.png; CSV: %s/convergence.csv\n",
                out.c_str(), out.c_str(), out.c_str());
    if (!json.empty()) {
      const nlohmann::json j = {{"preset", preset},
                                {"peers", peers},
                                {"steps", steps},
                                {"batch", batch},
                                {"seq_len", seq_len},
                                {"tokens", static_cast<double>(steps * batch * seq_len)},
                                {"target_val_loss", target},
                                {"runs", runs_json}};
      fs::create_directories(fs::path(json).parent_path().empty() ? "."
                                                                  : fs::path(json).parent_path());
      agora::write_file_atomic(json, j.dump(2));
    }
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "bench_convergence: %s\n", e.what());
    return 1;
  }
  return 0;
}
