// bench_tst: does Token Superposition Training (docs/algorithms.md section 4) reach the same loss
// in less time at the same FLOPs? Every run trains the same model with the same optimizer, batch,
// sequence length, schedule and number of steps on the bundled corpus; only [tst] differs: the
// baseline (next-token training throughout) against bags of s = 2, 4, 8 for the first r = 0.3 of
// the steps.
//
// For each run: the ordinary next-token validation loss every --eval-interval steps against
// steps and against training time (evaluations excluded, so the bag-loss evaluations of phase 1
// do not count against TST); the speedup = the baseline's time to its final loss / the run's
// time to the same loss (linear interpolation between evaluations), and the same in steps; and
// for a run that never gets there, the baseline's time to the run's own final loss over the
// run's time ("vs baseline", below 1 when TST is slower).
// Writes OUT/tst.csv, OUT/loss_vs_steps.png, OUT/loss_vs_time.png (gnuplot) and --json FILE.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/obs/progress.h"
#include "agora/train/trainer.h"

namespace fs = std::filesystem;
using agora::EvalPoint;
using agora::RunConfig;

namespace {

struct Run {
  std::string name;  // baseline, tst_s2, ...
  int64_t bag = 1;   // 1: the baseline
};

struct Result {
  Run run;
  std::vector<EvalPoint> curve;
  int64_t switch_step = 0;
  double seconds = 0, tokens_per_second = 0;
  uint64_t data_tokens = 0;
};

// Where the curve first reaches `target`, by linear interpolation between the two evaluations
// around the crossing, in steps and in training seconds; nullopt when it never does.
struct Crossing {
  double step, seconds;
};
std::optional<Crossing> reach(const std::vector<EvalPoint>& curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].val_loss > target) continue;
    if (i == 0) return Crossing{double(curve[0].step), curve[0].train_seconds};
    const EvalPoint &a = curve[i - 1], &b = curve[i];
    const double f = (a.val_loss - target) / (a.val_loss - b.val_loss);
    return Crossing{a.step + f * double(b.step - a.step),
                    a.train_seconds + f * (b.train_seconds - a.train_seconds)};
  }
  return std::nullopt;
}

void write_plots(const fs::path& out, const std::vector<Result>& results, int64_t switch_step) {
  std::string script =
      "set terminal pngcairo size 1000,640 font ',11'\n"
      "set datafile separator ','\nset grid\nset key top right\n"
      "set ylabel 'validation loss, next token (nats)'\n";
  const auto plot = [&](const std::string& file, const std::string& xlabel, int column,
                        bool mark_switch) {
    script += fmt::format("set output '{}'\nset xlabel '{}'\nunset arrow\n", (out / file).string(),
                          xlabel);
    if (mark_switch && switch_step > 0) {
      script += fmt::format(
          "set arrow from {0},graph 0 to {0},graph 1 nohead dashtype 2 lc rgb 'gray40'\n"
          "set label 1 'TST switch (step {0})' at {0},graph 0.95 offset 0.5,0 tc rgb 'gray40'\n",
          switch_step);
    } else {
      script += "unset label 1\n";
    }
    script += "plot ";
    for (size_t i = 0; i < results.size(); ++i) {
      script += fmt::format("{}'{}' using {}:4 with linespoints title '{}'", i ? ", " : "",
                            (out / ("curve_" + results[i].run.name + ".csv")).string(), column,
                            results[i].run.bag == 1 ? std::string("baseline (next token)")
                                                    : fmt::format("TST s={}", results[i].run.bag));
    }
    script += "\n";
  };
  plot("loss_vs_steps.png", "optimizer steps (same FLOPs per step in every run)", 1, true);
  plot("loss_vs_time.png", "training time (s), evaluations excluded", 2, false);
  agora::write_file_atomic(out / "plots.gp", script);
  const std::string command = fmt::format("gnuplot '{}'", (out / "plots.gp").string());
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "warning: gnuplot failed (is gnuplot-nox installed?); CSV kept\n");
  }
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Token Superposition Training against next-token training at equal FLOPs"};
  std::string data = "data/tokens/sp8k", preset = "small", optimizer = "adamw";
  std::string out = "out/bench/tst", json, bags_text = "2,4,8";
  int64_t seq_len = 128, batch = 8, micro = 8, steps = 500, eval_interval = 25;
  int64_t eval_windows = 32, warmup = 25, threads = 0;
  double fraction = 0.3, lr = 3e-3;
  app.add_option("--data", data, "Token folder (agora tokenize)");
  app.add_option("--preset", preset, "Model preset (small: ~10.7M parameters)");
  app.add_option("--optimizer", optimizer,
                 "adamw | demo | diloco (one process, one peer; diloco syncs every 50 steps)");
  app.add_option("--lr", lr);
  app.add_option("--seq-len", seq_len);
  app.add_option("--batch", batch, "Sequences per step");
  app.add_option("--micro-batch", micro);
  app.add_option("--steps", steps);
  app.add_option("--eval-interval", eval_interval);
  app.add_option("--eval-windows", eval_windows);
  app.add_option("--warmup", warmup, "Warmup steps (cosine schedule after)");
  app.add_option("--threads", threads, "0 = every core");
  app.add_option("--bags", bags_text, "Comma-separated bag sizes s to compare with the baseline");
  app.add_option("--fraction", fraction, "r: the share of the steps trained on bags");
  app.add_option("--out", out, "Folder for the CSV and the plots");
  app.add_option("--json", json, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  std::vector<Run> runs = {{"baseline", 1}};
  for (size_t at = 0; at < bags_text.size();) {
    const size_t comma = std::min(bags_text.find(',', at), bags_text.size());
    const std::string item = bags_text.substr(at, comma - at);
    at = comma + 1;
    char* end = nullptr;
    const long s = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || s < 2) {
      std::fprintf(stderr,
                   "bench_tst: --bags \"%s\": \"%s\" is not a bag size (allowed: integers >= 2)\n",
                   bags_text.c_str(), item.c_str());
      return 2;
    }
    runs.push_back({fmt::format("tst_s{}", s), s});
  }

  try {
    fs::create_directories(out);
    std::vector<Result> results;
    // The first steps of a process pay for thread pools and allocator growth; a short throwaway
    // run pays them before anything is timed, so the baseline (first) is not charged for them.
    const auto config_for = [&](const Run& run, int64_t run_steps) {
      std::vector<std::string> overrides = {
          "model.preset=" + preset,
          "data.dir=" + data,
          fmt::format("data.seq_len={}", seq_len),
          fmt::format("train.steps={}", run_steps),
          fmt::format("train.batch_size={}", batch),
          fmt::format("train.micro_batch_size={}", micro),
          fmt::format("train.eval_interval={}", eval_interval),
          fmt::format("train.eval_windows={}", eval_windows),
          fmt::format("train.threads={}", threads),
          "train.out_dir=" + (fs::path(out) / ("run_" + run.name)).string(),
          "optimizer.name=" + optimizer,
          fmt::format("optimizer.lr={}", lr),
          "schedule.kind=cosine",
          fmt::format("schedule.warmup_steps={}", warmup),
          fmt::format("tst.bag={}", run.bag),
          fmt::format("tst.fraction={}", run.bag == 1 ? 0.0 : fraction),
      };
      return RunConfig::parse("", "bench_tst", overrides);
    };
    {
      std::fprintf(stderr, "== warm-up (not timed)\n");
      agora::TrainOptions quiet;
      quiet.progress = false;
      agora::train(config_for(runs[0], std::min<int64_t>(steps, warmup + 3)), quiet);
    }
    for (const Run& run : runs) {
      const RunConfig config = config_for(run, steps);
      std::fprintf(stderr, "\n== %s\n", run.name.c_str());

      Result r{run, {}, config.tst_switch_step(), 0, 0, config.data_tokens_through(steps)};
      agora::TrainOptions options;
      options.on_eval = [&](const EvalPoint& p) { r.curve.push_back(p); };
      const agora::TrainSummary summary = agora::train(config, options);
      r.seconds = summary.seconds;
      r.tokens_per_second = summary.tokens_per_second;
      std::string csv = "step,train_seconds,data_tokens,val_loss,bag_val_loss\n";
      for (const EvalPoint& p : r.curve) {
        csv += fmt::format(
            "{},{:.3f},{},{:.6f},{}\n", p.step, p.train_seconds, config.data_tokens_through(p.step),
            p.val_loss, std::isfinite(p.bag_val_loss) ? fmt::format("{:.6f}", p.bag_val_loss) : "");
      }
      agora::write_file_atomic(fs::path(out) / ("curve_" + run.name + ".csv"), csv);
      results.push_back(std::move(r));
    }

    std::string all = "run,bag,step,train_seconds,val_loss,bag_val_loss\n";
    for (const Result& r : results) {
      for (const EvalPoint& p : r.curve) {
        all += fmt::format(
            "{},{},{},{:.3f},{:.6f},{}\n", r.run.name, r.run.bag, p.step, p.train_seconds,
            p.val_loss, std::isfinite(p.bag_val_loss) ? fmt::format("{:.6f}", p.bag_val_loss) : "");
      }
    }
    agora::write_file_atomic(fs::path(out) / "tst.csv", all);
    const int64_t switch_step = results.size() > 1 ? results[1].switch_step : 0;
    write_plots(out, results, switch_step);

    const Result& base = results[0];
    const EvalPoint& base_final = base.curve.back();
    const double target = base_final.val_loss;
    std::printf(
        "\ntst: %s, %s lr %g, %lld steps x %lld x %lld positions, r = %g (switch at step %lld); "
        "target = the baseline's final val loss %.4f\n\n",
        preset.c_str(), optimizer.c_str(), lr, static_cast<long long>(steps),
        static_cast<long long>(batch), static_cast<long long>(seq_len), fraction,
        static_cast<long long>(switch_step), target);
    std::printf("%-10s %10s %12s %12s %10s %12s %10s %10s %12s %14s\n", "run", "final val",
                "data tokens", "train time", "tokens/s", "steps to", "time to", "speedup",
                "step speedup", "vs baseline");
    nlohmann::json runs_json = nlohmann::json::array();
    for (const Result& r : results) {
      // NaN where the run never reaches the target (printed as "-", written as null).
      const std::optional<Crossing> at = reach(r.curve, target);
      const double steps_to = at ? at->step : NAN, seconds_to = at ? at->seconds : NAN;
      const double speedup = base_final.train_seconds / seconds_to;
      const double step_speedup = double(base_final.step) / steps_to;
      const double final_val = r.curve.back().val_loss;
      // The other way round, defined whether or not the run reached the target: the baseline's
      // time to this run's final loss over this run's time. Below 1: slower than the baseline.
      const std::optional<Crossing> base_at = reach(base.curve, final_val);
      const double equivalent = base_at ? base_at->seconds / r.curve.back().train_seconds : NAN;
      const double equivalent_steps = base_at ? base_at->step / double(r.curve.back().step) : NAN;
      const auto cell = [](double v, const std::string& text) {
        return std::isfinite(v) ? text : std::string("-");
      };
      std::printf("%-10s %10.4f %12s %12s %10.0f %12s %10s %10s %12s %14s\n", r.run.name.c_str(),
                  final_val, fmt::format("{:.2f}M", double(r.data_tokens) / 1e6).c_str(),
                  agora::format_duration(r.curve.back().train_seconds).c_str(), r.tokens_per_second,
                  at ? fmt::format("{:.0f}", steps_to).c_str() : "not reached",
                  cell(seconds_to, at ? agora::format_duration(seconds_to) : "").c_str(),
                  cell(speedup, fmt::format("{:.2f}x", speedup)).c_str(),
                  cell(step_speedup, fmt::format("{:.2f}x", step_speedup)).c_str(),
                  cell(equivalent, fmt::format("{:.2f}x", equivalent)).c_str());
      nlohmann::json curve = nlohmann::json::array();
      for (const EvalPoint& p : r.curve) {
        curve.push_back({{"step", p.step},
                         {"train_seconds", p.train_seconds},
                         {"val_loss", p.val_loss},
                         {"bag_val_loss", number_or_null(p.bag_val_loss)}});
      }
      runs_json.push_back(
          {{"name", r.run.name},
           {"bag", r.run.bag},
           {"switch_step", r.switch_step},
           {"data_tokens", r.data_tokens},
           {"final_val_loss", final_val},
           {"train_seconds", r.curve.back().train_seconds},
           {"seconds_with_evaluations", r.seconds},
           {"tokens_per_second", r.tokens_per_second},
           {"steps_to_target", number_or_null(steps_to)},
           {"seconds_to_target", number_or_null(seconds_to)},
           {"speedup", number_or_null(speedup)},
           {"step_speedup", number_or_null(step_speedup)},
           {"baseline_steps_to_final", number_or_null(base_at ? base_at->step : NAN)},
           {"equivalent_speedup", number_or_null(equivalent)},
           {"equivalent_step_speedup", number_or_null(equivalent_steps)},
           {"curve", curve}});
    }
    std::printf(
        "\nspeedup = the baseline's training time to its final loss / the run's time to "
        "the same loss (goal: >= 1.5x); vs baseline = the baseline's time to the run's final "
        "loss / the run's time (defined when the run ends above the baseline's final loss)\n");
    std::printf("plots: %s/loss_vs_steps.png, %s/loss_vs_time.png; CSV: %s/tst.csv\n", out.c_str(),
                out.c_str(), out.c_str());
    if (!json.empty()) {
      const nlohmann::json j = {{"preset", preset},
                                {"optimizer", optimizer},
                                {"lr", lr},
                                {"steps", steps},
                                {"batch", batch},
                                {"seq_len", seq_len},
                                {"fraction", fraction},
                                {"switch_step", switch_step},
                                {"target_val_loss", target},
                                {"goal_speedup", 1.5},
                                {"runs", runs_json}};
      fs::create_directories(fs::path(json).parent_path().empty() ? "."
                                                                  : fs::path(json).parent_path());
      agora::write_file_atomic(json, j.dump(2));
    }
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "bench_tst: %s\n", e.what());
    return 1;
  }
  return 0;
}
