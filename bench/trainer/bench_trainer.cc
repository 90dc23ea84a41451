// bench_trainer: training throughput of agora's step beside the same step in Python PyTorch
// (Debian's python3-torch, the same libtorch), on the same model, batch and threads, in one run.
//
// For each preset (--presets, default tiny and small) it measures, each in its own child process:
//   agora   this binary in --worker agora mode: the trainer's step (forward, next_token_loss,
//           backward, clip_grad_norm_(1.0), AdamWStrategy with decay on >= 2-D parameters), on
//           seeded random tokens, float32, micro-batch = batch;
//   python  reference_train.py, the same model, init, loss, clipping and AdamW, given the shape
//           from agora's ModelConfig so the two cannot drift;
//   python + mallopt  the same script with agora's glibc malloc settings (allocator.h) in its
//           environment, which shows how much of the difference is the allocator alone.
// Each side runs warm-up steps (untimed), then --repeats times --steps timed steps; the figure is
// the median tokens/s over the repeats. Peak memory is each child's ru_maxrss from wait4(), so
// both sides are measured the same way.
//
// The machine's ceiling is a float32 N x N @ N x N torch::matmul (the same BLAS, the same thread
// count), in a child too; MFU = tokens/s * FLOPs per token / ceiling, with
//   FLOPs per token = 6 * parameters + 12 * num_layers * seq_len * hidden_size
// (forward + backward of every weight, plus the attention scores and mixing; PaLM's formula).
//
// The launcher itself never touches a tensor, so it starts no BLAS or OpenMP threads and stays
// small: a child's ru_maxrss can include the forked copy of the launcher, which is reported.
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/core/allocator.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/subprocess.h"
#include "bench_options.h"
#include "child_process.h"
#include "workers.h"

namespace {

using nlohmann::json;

using agora::bench::anonymous_rss_mb;
using agora::bench::Child;
using agora::bench::command_line;
using agora::bench::defaults_for;
using agora::bench::Flags;
using agora::bench::flops_per_token;
using agora::bench::kBeta1;
using agora::bench::kBeta2;
using agora::bench::kEps;
using agora::bench::kGradClip;
using agora::bench::kLr;
using agora::bench::kWeightDecay;
using agora::bench::median;
using agora::bench::Options;
using agora::bench::run_child;
using agora::bench::Shape;
using agora::bench::shape_for;

constexpr const char* kFlopsFormula =
    "6 * parameters + 12 * num_layers * seq_len * hidden_size (per token, forward + backward, "
    "attention included)";

// agora::tune_allocator_for_tensors()'s glibc settings (allocator.cc), as environment variables,
// for the Python run that isolates how much of the difference is the allocator.
const std::vector<std::string> kMalloptEnvironment = {
    "MALLOC_MMAP_THRESHOLD_=33554432",    // M_MMAP_THRESHOLD 32 MiB
    "MALLOC_TRIM_THRESHOLD_=1073741824",  // M_TRIM_THRESHOLD 1 GiB
    "MALLOC_TOP_PAD_=67108864",           // M_TOP_PAD 64 MiB
};

// Goals from the issue, shown beside the measured values (never asserted).
constexpr double kGoalRatioSmall = 1.0, kGoalRatioTiny = 1.5, kGoalMfuSmall = 0.60;

// One implementation's figures on one preset.
struct Figures {
  std::string implementation;
  int threads = 0;
  int64_t parameters = 0;
  std::vector<double> tokens_per_s;
  double first_loss = NAN, last_loss = NAN;
  double peak_rss_mb = 0;
  double seconds = 0;  // the child's wall time, start-up included

  double median_tps() const { return median(tokens_per_s); }
};

Figures figures_from(const std::string& implementation, const Child& child) {
  Figures f;
  f.implementation = implementation;
  f.threads = child.output.at("threads").get<int>();
  f.parameters = child.output.at("parameters").get<int64_t>();
  f.tokens_per_s = child.output.at("tokens_per_s").get<std::vector<double>>();
  f.first_loss = child.output.at("first_loss").get<double>();
  f.last_loss = child.output.at("last_loss").get<double>();
  f.peak_rss_mb = child.peak_rss_mb;
  f.seconds = child.seconds;
  return f;
}

struct PresetResult {
  std::string preset;
  agora::ModelConfig config;
  Shape shape{};
  Figures agora;
  std::optional<Figures> python;          // stock Python: the goals' reference
  std::optional<Figures> python_mallopt;  // Python with agora's malloc settings

  std::vector<const Figures*> rows() const {
    std::vector<const Figures*> out = {&agora};
    if (python) out.push_back(&*python);
    if (python_mallopt) out.push_back(&*python_mallopt);
    return out;
  }
};

Figures measure_agora(const Options& o, const std::string& preset, const Shape& shape) {
  const Flags flags = {
      {"--worker", "agora"},
      {"--preset", preset},
      {"--vocab", std::to_string(o.vocab)},
      {"--seq-len", std::to_string(shape.seq_len)},
      {"--batch", std::to_string(o.batch)},
      {"--threads", std::to_string(o.threads)},
      {"--warmup", std::to_string(shape.warmup)},
      {"--steps", std::to_string(shape.steps)},
      {"--repeats", std::to_string(o.repeats)},
      {"--seed", std::to_string(o.seed)},
  };
  return figures_from("agora (C++)",
                      run_child(command_line({agora::this_executable().string()}, flags),
                                "the agora worker for " + preset));
}

Figures measure_python(const Options& o, const agora::ModelConfig& c, const Shape& shape,
                       bool mallopt) {
  const auto num = [](double v) { return fmt::format("{:.17g}", v); };
  const Flags flags = {
      {"--vocab-size", std::to_string(c.vocab_size)},
      {"--hidden-size", std::to_string(c.hidden_size)},
      {"--intermediate-size", std::to_string(c.intermediate_size)},
      {"--num-layers", std::to_string(c.num_layers)},
      {"--num-heads", std::to_string(c.num_heads)},
      {"--num-kv-heads", std::to_string(c.num_kv_heads)},
      {"--tie-embeddings", c.tie_embeddings ? "1" : "0"},
      {"--rope-theta", num(c.rope_theta)},
      {"--rms-norm-eps", num(c.rms_norm_eps)},
      {"--init-std", num(c.init_std)},
      {"--seq-len", std::to_string(c.max_seq_len)},
      {"--batch", std::to_string(o.batch)},
      {"--threads", std::to_string(o.threads)},
      {"--warmup", std::to_string(shape.warmup)},
      {"--steps", std::to_string(shape.steps)},
      {"--repeats", std::to_string(o.repeats)},
      {"--seed", std::to_string(o.seed)},
      {"--lr", num(kLr)},
      {"--beta1", num(kBeta1)},
      {"--beta2", num(kBeta2)},
      {"--eps", num(kEps)},
      {"--weight-decay", num(kWeightDecay)},
      {"--grad-clip", num(kGradClip)},
  };
  return figures_from(mallopt ? "python + mallopt" : "python (PyTorch)",
                      run_child(command_line({o.python, o.script}, flags),
                                "the Python reference for " + c.preset + " (" + o.script + ")",
                                mallopt ? kMalloptEnvironment : std::vector<std::string>{}));
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string goal_mark(bool met) {
  return met ? "met" : "MISSED";
}

int run_launcher(const Options& o) {
  const std::vector<std::string> presets = split(o.presets);
  if (presets.empty())
    agora::fail("--presets is empty (allowed: a comma-separated list of presets)");
  for (const std::string& p : presets) defaults_for(p);  // unknown names fail before any work
  const unsigned nproc = std::thread::hardware_concurrency();

  const double launcher_anon_mb = anonymous_rss_mb();

  std::cout << fmt::format(
      "bench_trainer: nproc {}, {} threads, batch {} (= micro-batch), vocab {}, float32, "
      "{} repeats (medians)\nFLOPs per token = {}\nMFU = tokens/s * FLOPs per token / sgemm "
      "ceiling\npeak MB = each child's ru_maxrss from wait4(), MB = 10^6 bytes (it cannot read "
      "below the launcher's {:.0f} MB of anonymous memory, which a child holds from fork to exec)"
      "\n\n",
      nproc, o.threads, o.batch, o.vocab, o.repeats, kFlopsFormula, launcher_anon_mb);

  // The ceiling first, while nothing else of ours runs.
  const Flags sgemm_flags = {
      {"--worker", "sgemm"},
      {"--threads", std::to_string(o.threads)},
      {"--repeats", std::to_string(o.repeats)},
      {"--seed", std::to_string(o.seed)},
      {"--sgemm-size", std::to_string(o.sgemm_size)},
      {"--sgemm-iters", std::to_string(o.sgemm_iters)},
  };
  const Child sgemm =
      run_child(command_line({agora::this_executable().string()}, sgemm_flags), "the sgemm worker");
  const std::vector<double> sgemm_gflops = sgemm.output.at("gflops").get<std::vector<double>>();
  // A ceiling is the best the machine showed: on a shared machine the median of the sgemm
  // repeats understates it, which would overstate utilisation.
  const double ceiling_gflops = *std::max_element(sgemm_gflops.begin(), sgemm_gflops.end());
  std::cout << fmt::format(
      "sgemm ceiling: {0}x{0} @ {0}x{0} float32 torch::matmul, {1} threads: "
      "{2:.1f} GFLOP/s (best of {3}; median {4:.1f}, min {5:.1f})\n\n",
      o.sgemm_size, sgemm.output.at("threads").get<int>(), ceiling_gflops, sgemm_gflops.size(),
      median(sgemm_gflops), *std::min_element(sgemm_gflops.begin(), sgemm_gflops.end()));

  std::vector<PresetResult> results;
  for (const std::string& preset : presets) {
    PresetResult r;
    r.preset = preset;
    r.shape = shape_for(o, preset);
    r.config = agora::model_preset(preset, o.vocab, r.shape.seq_len);
    std::cerr << fmt::format("[{}] agora: {} warm-up + {} x {} steps of {} x {} tokens...\n",
                             preset, r.shape.warmup, o.repeats, r.shape.steps, o.batch,
                             r.shape.seq_len);
    r.agora = measure_agora(o, preset, r.shape);
    if (!o.no_python) {
      std::cerr << fmt::format("[{}] python: the same...\n", preset);
      r.python = measure_python(o, r.config, r.shape, false);
      if (!o.no_python_mallopt) {
        std::cerr << fmt::format("[{}] python with agora's malloc settings...\n", preset);
        r.python_mallopt = measure_python(o, r.config, r.shape, true);
      }
    }
    results.push_back(std::move(r));
  }

  const auto mfu = [&](const PresetResult& r, const Figures& f) {
    return f.median_tps() * static_cast<double>(flops_per_token(r.config)) / (ceiling_gflops * 1e9);
  };

  std::cout << fmt::format("{:<10} {:>7} {:>11} {:<17} {:>7} {:>11} {:>13} {:>7} {:>9} {:>11}\n",
                           "preset", "seq_len", "params", "implementation", "threads", "tokens/s",
                           "min..max", "MFU", "peak MB", "vs python");
  for (const PresetResult& r : results) {
    for (const Figures* f : r.rows()) {
      const auto [lo, hi] = std::minmax_element(f->tokens_per_s.begin(), f->tokens_per_s.end());
      const std::string ratio =
          r.python ? fmt::format("{:.2f}x", f->median_tps() / r.python->median_tps()) : "-";
      std::cout << fmt::format(
          "{:<10} {:>7} {:>10.2f}M {:<17} {:>7} {:>11.0f} {:>6.0f}..{:<6.0f} {:>6.1f}% {:>9.0f} "
          "{:>11}\n",
          r.preset, r.shape.seq_len, f->parameters / 1e6, f->implementation, f->threads,
          f->median_tps(), *lo, *hi, 100 * mfu(r, *f), f->peak_rss_mb, ratio);
    }
  }

  // Honesty checks: the two sides must train the same model.
  bool agree = true, losses_agree = true;
  std::cout << "\n";
  for (const PresetResult& r : results) {
    const int64_t expected = r.config.num_parameters();
    if (r.agora.parameters != expected) {
      agree = false;
      std::cout << fmt::format(
          "!!!!! PARAMETER COUNT MISMATCH ({}): agora's model has {} parameters, its "
          "ModelConfig::num_parameters() says {} !!!!!\n",
          r.preset, r.agora.parameters, expected);
    }
    if (r.python && r.python->parameters != r.agora.parameters) {
      agree = false;
      std::cout << fmt::format(
          "!!!!! PARAMETER COUNT MISMATCH ({}): agora {} vs python {} -- the two sides do not "
          "train the same model; the comparison is meaningless !!!!!\n",
          r.preset, r.agora.parameters, r.python->parameters);
    }
    // Same seed, same init order, same tokens and the same kernels: the losses should agree
    // (to the last digit so far); the last step's allows for rounding that grows over steps.
    for (const Figures* f : r.rows()) {
      if (f == &r.agora) continue;
      const bool first_ok = std::abs(r.agora.first_loss - f->first_loss) <= 1e-3;
      const bool last_ok = std::abs(r.agora.last_loss - f->last_loss) <= 1e-2;
      losses_agree = losses_agree && first_ok && last_ok;
      std::cout << fmt::format(
          "{}: loss at the first / last step: agora {:.6f} / {:.6f}, {} {:.6f} / {:.6f}{}\n",
          r.preset, r.agora.first_loss, r.agora.last_loss, f->implementation, f->first_loss,
          f->last_loss,
          first_ok && last_ok ? " (agree)"
                              : "\n!!!!! THE TWO SIDES' LOSSES DIFFER: check that they train the "
                                "same model with the same step !!!!!");
    }
    if (r.python_mallopt) {
      std::cout << fmt::format(
          "{}: agora / python with agora's malloc settings ({}): {:.2f}x tokens/s\n", r.preset,
          fmt::join(kMalloptEnvironment, " "),
          r.agora.median_tps() / r.python_mallopt->median_tps());
    }
  }

  // Goals from the issue, next to what was measured.
  json goals = json::array();
  std::string goal_lines;
  for (const PresetResult& r : results) {
    if (r.python && (r.preset == "small" || r.preset == "tiny")) {
      const double target = r.preset == "small" ? kGoalRatioSmall : kGoalRatioTiny;
      const double ratio = r.agora.median_tps() / r.python->median_tps();
      goal_lines +=
          fmt::format("{:<38} >= {:.2f}x  {:>8.2f}x   {}\n", r.preset + ": tokens/s agora / python",
                      target, ratio, goal_mark(ratio >= target));
      goals.push_back({{"goal", r.preset + " tokens/s ratio agora/python"},
                       {"target", target},
                       {"measured", ratio},
                       {"met", ratio >= target}});
    }
    if (r.preset == "small") {
      const double m = mfu(r, r.agora);
      goal_lines += fmt::format("{:<38} >= {:.0f}%    {:>8.1f}%   {}\n", "small: agora MFU",
                                100 * kGoalMfuSmall, 100 * m, goal_mark(m >= kGoalMfuSmall));
      goals.push_back({{"goal", "small agora MFU"},
                       {"target", kGoalMfuSmall},
                       {"measured", m},
                       {"met", m >= kGoalMfuSmall}});
    }
    if (r.python) {
      const double ratio = r.agora.peak_rss_mb / r.python->peak_rss_mb;
      goal_lines +=
          fmt::format("{:<38} <= 1.00x  {:>8.2f}x   {}  ({:.0f} vs {:.0f} MB)\n",
                      r.preset + ": peak RSS agora / python", ratio, goal_mark(ratio <= 1.0),
                      r.agora.peak_rss_mb, r.python->peak_rss_mb);
      goals.push_back({{"goal", r.preset + " peak RSS agora <= python"},
                       {"target", 1.0},
                       {"measured", ratio},
                       {"met", ratio <= 1.0}});
    }
  }

  if (!goal_lines.empty()) {
    std::cout << "\ngoals (from the issue)                 target     measured\n" << goal_lines;
  }

  if (!o.json_path.empty()) {
    json out;
    out["benchmark"] = "trainer";
    out["nproc"] = nproc;
    out["threads"] = o.threads;
    out["batch"] = o.batch;
    out["micro_batch"] = o.batch;
    out["vocab_size"] = o.vocab;
    out["dtype"] = "float32";
    out["repeats"] = o.repeats;
    out["seed"] = o.seed;
    out["optimizer"] = {{"name", "adamw"},
                        {"lr", kLr},
                        {"beta1", kBeta1},
                        {"beta2", kBeta2},
                        {"eps", kEps},
                        {"weight_decay", kWeightDecay},
                        {"weight_decay_on", "parameters with >= 2 dims"},
                        {"grad_clip", kGradClip}};
    out["flops_per_token_formula"] = kFlopsFormula;
    out["mfu_formula"] = "tokens_per_s * flops_per_token / (sgemm_gflops_best * 1e9)";
    out["peak_rss"] = "ru_maxrss of each child process from wait4(), MB = 10^6 bytes";
    out["launcher_anonymous_rss_mb"] = launcher_anon_mb;
    out["sgemm"] = {{"size", o.sgemm_size},
                    {"iterations_per_repeat", o.sgemm_iters},
                    {"threads", sgemm.output.at("threads")},
                    {"gflops", sgemm_gflops},
                    {"gflops_median", median(sgemm_gflops)},
                    {"gflops_best", ceiling_gflops}};
    out["parameters_agree"] = agree;
    out["losses_agree"] = losses_agree;
    out["python_mallopt_environment"] = kMalloptEnvironment;
    for (const PresetResult& r : results) {
      json p = {{"preset", r.preset},
                {"parameters", r.config.num_parameters()},
                {"hidden_size", r.config.hidden_size},
                {"intermediate_size", r.config.intermediate_size},
                {"num_layers", r.config.num_layers},
                {"num_heads", r.config.num_heads},
                {"num_kv_heads", r.config.num_kv_heads},
                {"tie_embeddings", r.config.tie_embeddings},
                {"padded_vocab_size", r.config.padded_vocab_size()},
                {"seq_len", r.shape.seq_len},
                {"warmup_steps", r.shape.warmup},
                {"timed_steps_per_repeat", r.shape.steps},
                {"tokens_per_step", o.batch * r.shape.seq_len},
                {"flops_per_token", flops_per_token(r.config)}};
      for (const Figures* f : r.rows()) {
        p["results"].push_back({{"implementation", f->implementation},
                                {"threads", f->threads},
                                {"parameters", f->parameters},
                                {"tokens_per_s", f->tokens_per_s},
                                {"tokens_per_s_median", f->median_tps()},
                                {"mfu", mfu(r, *f)},
                                {"peak_rss_mb", f->peak_rss_mb},
                                {"first_loss", f->first_loss},
                                {"last_loss", f->last_loss},
                                {"process_seconds", f->seconds}});
      }
      if (r.python) {
        p["ratio_tokens_per_s"] = r.agora.median_tps() / r.python->median_tps();
        p["ratio_peak_rss"] = r.agora.peak_rss_mb / r.python->peak_rss_mb;
      }
      if (r.python_mallopt) {
        p["ratio_tokens_per_s_vs_python_mallopt"] =
            r.agora.median_tps() / r.python_mallopt->median_tps();
        p["ratio_peak_rss_vs_python_mallopt"] = r.agora.peak_rss_mb / r.python_mallopt->peak_rss_mb;
      }
      out["presets"].push_back(p);
    }
    out["goals"] = goals;
    const std::filesystem::path json_file(o.json_path);
    if (json_file.has_parent_path()) std::filesystem::create_directories(json_file.parent_path());
    agora::write_file_atomic(json_file, out.dump(2) + "\n");
  }
  return agree && losses_agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  agora::tune_allocator_for_tensors();
  CLI::App app{"Training throughput: agora's step against the same step in Python PyTorch"};
  Options o;
  app.add_option("--presets", o.presets, "Comma-separated model presets")->capture_default_str();
  app.add_option("--vocab", o.vocab, "Vocabulary size (padded to 64 in the model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seq-len", o.seq_len,
                 "Sequence length for every preset (default per preset: tiny 64, small 256, "
                 "gpt2-124m 1024, 1b 2048)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Sequences per step (= micro-batch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Threads (torch::set_num_threads) for every side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup,
                 "Untimed warm-up steps (default per preset: tiny 5, small 2, larger 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps,
                 "Timed steps per repeat (default per preset: tiny 30, small 3, gpt2-124m 2, 1b 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", o.repeats, "Timed repeats (the median is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the model and the random tokens")
      ->capture_default_str();
  app.add_option("--sgemm-size", o.sgemm_size, "N of the N x N sgemm ceiling")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--sgemm-iters", o.sgemm_iters, "sgemm calls per timed repeat")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--python", o.python, "Python with torch")->capture_default_str();
  app.add_option("--script", o.script, "The Python reference")->capture_default_str();
  app.add_flag("--no-python", o.no_python, "Skip the Python measurements");
  app.add_flag("--no-python-mallopt", o.no_python_mallopt,
               "Skip the second Python run, with agora's malloc settings in its environment");
  app.add_option("--json", o.json_path, "Write all figures to this JSON file");
  app.add_option("--worker", o.worker, "(internal) run one measurement: agora or sgemm")
      ->check(CLI::IsMember({"agora", "sgemm"}))
      ->group("");
  app.add_option("--preset", o.preset, "(internal) the worker's preset")->group("");
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.worker.empty()) return run_launcher(o);
    const json result =
        o.worker == "sgemm" ? agora::bench::sgemm_worker(o) : agora::bench::agora_worker(o);
    std::cout << result.dump() << std::endl;
    return 0;
  } catch (const agora::Error& e) {
    std::cerr << "bench_trainer: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "bench_trainer: " << e.what() << "\n";
    return 1;
  }
}
