// bench_trainer: training throughput of agora's step beside the same step in Python PyTorch
// (Debian's python3-torch, the same libtorch), on the same model, batch and threads, in one run.
//
// For each case (--cases, a preset at a shape: "tiny:32x128/8" is 32 sequences of 128 tokens per
// step in micro-batches of 8) it measures, each in its own child process:
//   agora            this binary in --worker agora mode: the trainer's step (per micro-batch the
//                    forward, next_token_loss scaled by the micro-batch's share, backward; then
//                    clip_grad_norm_(1.0) and AdamWStrategy with decay on >= 2-D parameters), on
//                    seeded random tokens, float32, with agora's allocator tuning (allocator.h);
//   agora, glibc     the same with AGORA_MALLOC=system: glibc's defaults, which shows what the
//                    allocator tuning is worth;
//   python           reference_train.py, the same model, init, loss, micro-batches, clipping and
//                    AdamW, given the shape from agora's ModelConfig so the two cannot drift;
//   python + mallopt the same script with agora's glibc malloc settings in its environment, so
//                    the comparison with Python is not only a comparison of allocators.
// Each side runs warm-up steps (untimed), then --repeats times the timed steps; the figure is
// the median tokens/s over the repeats. Over the timed steps each side also reports minor page
// faults per step and the kernel's share of its CPU time (getrusage), the signature of memory
// that is mapped and faulted in again every step. Peak memory is each child's ru_maxrss from
// wait4(), so both sides are measured the same way.
//
// The machine's ceiling is a float32 N x N @ N x N torch::matmul (the same BLAS, the same thread
// count), in a child too; MFU = tokens/s * FLOPs per token / ceiling, with
//   FLOPs per token = 6 * matmul parameters + 12 * num_layers * seq_len * hidden_size
// (forward + backward of every weight that multiplies, i.e. all but an untied input embedding,
// which is a lookup; plus the attention scores and mixing; PaLM's formula).
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
using agora::bench::Case;
using agora::bench::Child;
using agora::bench::command_line;
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
using agora::bench::parse_case;
using agora::bench::run_child;

constexpr const char* kFlopsFormula =
    "6 * matmul parameters (all but an untied input embedding) + 12 * num_layers * seq_len * "
    "hidden_size (per token, forward + backward, attention included)";

// agora::tune_allocator_for_tensors()'s glibc settings (allocator.cc), as environment variables,
// for the Python run that isolates how much of the difference is the allocator.
const std::vector<std::string> kMalloptEnvironment = {
    "MALLOC_MMAP_MAX_=0",                 // M_MMAP_MAX 0: no block is mmapped on its own
    "MALLOC_MMAP_THRESHOLD_=33554432",    // M_MMAP_THRESHOLD 32 MiB
    "MALLOC_TRIM_THRESHOLD_=1073741824",  // M_TRIM_THRESHOLD 1 GiB
    "MALLOC_TOP_PAD_=67108864",           // M_TOP_PAD 64 MiB
};
const std::vector<std::string> kSystemMallocEnvironment = {"AGORA_MALLOC=system"};

// The demo's and the convergence lab's shape, which the goals are about.
const std::string kDemoCase = "tiny:32x128/8";

// Goals from the issues, shown beside the measured values (never asserted).
constexpr double kGoalRatioSmall = 1.0, kGoalRatioTinyDemo = 1.5;
constexpr double kGoalMfuTinyDemo = 0.60, kGoalMfuSmall = 0.85;

// One implementation's figures on one case.
struct Figures {
  std::string implementation;
  int threads = 0;
  int64_t parameters = 0;
  std::vector<double> tokens_per_s;
  double first_loss = NAN, last_loss = NAN;
  double faults_per_step = NAN, system_share = NAN;
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
  f.faults_per_step = child.output.at("faults_per_step").get<double>();
  f.system_share = child.output.at("system_share").get<double>();
  f.peak_rss_mb = child.peak_rss_mb;
  f.seconds = child.seconds;
  return f;
}

struct CaseResult {
  Case c;
  agora::ModelConfig config;
  Figures agora;
  std::optional<Figures> agora_system;    // agora with glibc's malloc defaults
  std::optional<Figures> python;          // stock Python: the goals' reference
  std::optional<Figures> python_mallopt;  // Python with agora's malloc settings

  std::vector<const Figures*> rows() const {
    std::vector<const Figures*> out = {&agora};
    if (agora_system) out.push_back(&*agora_system);
    if (python) out.push_back(&*python);
    if (python_mallopt) out.push_back(&*python_mallopt);
    return out;
  }
};

Figures measure_agora(const Options& o, const Case& c, bool system_malloc) {
  const Flags flags = {
      {"--worker", "agora"},
      {"--case", c.name()},
      {"--vocab", std::to_string(o.vocab)},
      {"--threads", std::to_string(o.threads)},
      {"--warmup", std::to_string(c.warmup)},
      {"--steps", std::to_string(c.steps)},
      {"--repeats", std::to_string(o.repeats)},
      {"--seed", std::to_string(o.seed)},
  };
  return figures_from(
      system_malloc ? "agora, glibc" : "agora (C++)",
      run_child(command_line({agora::this_executable().string()}, flags),
                "the agora worker for " + c.name(),
                system_malloc ? kSystemMallocEnvironment : std::vector<std::string>{}));
}

Figures measure_python(const Options& o, const Case& k, const agora::ModelConfig& c,
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
      {"--batch", std::to_string(k.batch)},
      {"--micro-batch", std::to_string(k.micro_batch)},
      {"--threads", std::to_string(o.threads)},
      {"--warmup", std::to_string(k.warmup)},
      {"--steps", std::to_string(k.steps)},
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
                                "the Python reference for " + k.name() + " (" + o.script + ")",
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

json figures_json(const Figures& f, double mfu) {
  return {{"implementation", f.implementation},
          {"threads", f.threads},
          {"parameters", f.parameters},
          {"tokens_per_s", f.tokens_per_s},
          {"tokens_per_s_median", f.median_tps()},
          {"mfu", mfu},
          {"faults_per_step", f.faults_per_step},
          {"system_share", f.system_share},
          {"peak_rss_mb", f.peak_rss_mb},
          {"first_loss", f.first_loss},
          {"last_loss", f.last_loss},
          {"process_seconds", f.seconds}};
}

int run_launcher(const Options& o) {
  std::vector<Case> cases;
  for (const std::string& text : split(o.cases)) cases.push_back(parse_case(text, o.warmup, o.steps));
  if (cases.empty())
    agora::fail("--cases is empty (allowed: a comma-separated list like {})", kDemoCase);
  const unsigned nproc = std::thread::hardware_concurrency();

  const double launcher_anon_mb = anonymous_rss_mb();

  std::cout << fmt::format(
      "bench_trainer: nproc {}, {} threads, vocab {}, float32, {} repeats (medians); "
      "case = preset:BATCHxSEQ_LEN/MICRO_BATCH\nFLOPs per token = {}\nMFU = tokens/s * FLOPs "
      "per token / sgemm ceiling\nsys = kernel share of the CPU time, faults = minor page faults "
      "per step, both over the timed steps (getrusage)\npeak MB = each child's ru_maxrss from "
      "wait4(), MB = 10^6 bytes (it cannot read below the launcher's {:.0f} MB of anonymous "
      "memory, which a child holds from fork to exec)\n\n",
      nproc, o.threads, o.vocab, o.repeats, kFlopsFormula, launcher_anon_mb);

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

  std::vector<CaseResult> results;
  for (const Case& c : cases) {
    CaseResult r;
    r.c = c;
    r.config = agora::model_preset(c.preset, o.vocab, c.seq_len);
    std::cerr << fmt::format("[{}] agora: {} warm-up + {} x {} steps...\n", c.name(), c.warmup,
                             o.repeats, c.steps);
    r.agora = measure_agora(o, c, false);
    if (!o.no_system_malloc) {
      std::cerr << fmt::format("[{}] agora with glibc's malloc defaults...\n", c.name());
      r.agora_system = measure_agora(o, c, true);
    }
    if (!o.no_python) {
      std::cerr << fmt::format("[{}] python: the same...\n", c.name());
      r.python = measure_python(o, c, r.config, false);
      if (!o.no_python_mallopt) {
        std::cerr << fmt::format("[{}] python with agora's malloc settings...\n", c.name());
        r.python_mallopt = measure_python(o, c, r.config, true);
      }
    }
    results.push_back(std::move(r));
  }

  const auto mfu = [&](const CaseResult& r, const Figures& f) {
    return f.median_tps() * static_cast<double>(flops_per_token(r.config)) / (ceiling_gflops * 1e9);
  };

  std::cout << fmt::format("{:<16} {:>8} {:<17} {:>9} {:>13} {:>6} {:>6} {:>9} {:>8} {:>9}\n",
                           "case", "params", "implementation", "tokens/s", "min..max", "MFU",
                           "sys", "faults", "peak MB", "vs python");
  for (const CaseResult& r : results) {
    for (const Figures* f : r.rows()) {
      const auto [lo, hi] = std::minmax_element(f->tokens_per_s.begin(), f->tokens_per_s.end());
      const std::string ratio =
          r.python ? fmt::format("{:.2f}x", f->median_tps() / r.python->median_tps()) : "-";
      std::cout << fmt::format(
          "{:<16} {:>7.2f}M {:<17} {:>9.0f} {:>6.0f}..{:<6.0f} {:>5.1f}% {:>5.1f}% {:>9.0f} "
          "{:>8.0f} {:>9}\n",
          r.c.name(), f->parameters / 1e6, f->implementation, f->median_tps(), *lo, *hi,
          100 * mfu(r, *f), 100 * f->system_share, f->faults_per_step, f->peak_rss_mb, ratio);
    }
  }

  // Honesty checks: every side must train the same model.
  bool agree = true, losses_agree = true;
  std::cout << "\n";
  for (const CaseResult& r : results) {
    const int64_t expected = r.config.num_parameters();
    for (const Figures* f : r.rows()) {
      if (f->parameters == expected) continue;
      agree = false;
      std::cout << fmt::format(
          "!!!!! PARAMETER COUNT MISMATCH ({}): {}'s model has {} parameters, agora's "
          "ModelConfig::num_parameters() says {}: the comparison is meaningless !!!!!\n",
          r.c.name(), f->implementation, f->parameters, expected);
    }
    // Same seed, same init order, same tokens and the same kernels: the losses should agree
    // (to the last digit so far); the last step's allows for rounding that grows over steps.
    for (const Figures* f : r.rows()) {
      if (f == &r.agora) continue;
      const bool first_ok = std::abs(r.agora.first_loss - f->first_loss) <= 1e-3;
      const bool last_ok = std::abs(r.agora.last_loss - f->last_loss) <= 1e-2;
      losses_agree = losses_agree && first_ok && last_ok;
      if (!first_ok || !last_ok) {
        std::cout << fmt::format(
            "!!!!! {}: loss at the first / last step: agora {:.6f} / {:.6f}, {} {:.6f} / {:.6f}: "
            "THE SIDES' LOSSES DIFFER: check that they train the same model with the same step "
            "!!!!!\n",
            r.c.name(), r.agora.first_loss, r.agora.last_loss, f->implementation, f->first_loss,
            f->last_loss);
      }
    }
  }
  if (agree && losses_agree) {
    std::cout << "every implementation trained the same model to the same first and last loss "
                 "(within 1e-3 / 1e-2) in every case\n";
  }
  for (const CaseResult& r : results) {
    if (r.agora_system) {
      std::cout << fmt::format(
          "{}: agora's allocator tuning: {:.2f}x tokens/s over glibc's defaults, faults per step "
          "{:.0f} -> {:.0f}, system share {:.1f}% -> {:.1f}%\n",
          r.c.name(), r.agora.median_tps() / r.agora_system->median_tps(),
          r.agora_system->faults_per_step, r.agora.faults_per_step,
          100 * r.agora_system->system_share, 100 * r.agora.system_share);
    }
  }

  // Goals from the issues, next to what was measured.
  json goals = json::array();
  std::string goal_lines;
  const auto goal = [&](const std::string& what, const std::string& relation, double target,
                        double measured, bool percent) {
    const bool met = relation == ">=" ? measured >= target : measured <= target;
    goal_lines += percent ? fmt::format("{:<44} {} {:>5.0f}%  {:>8.1f}%   {}\n", what, relation,
                                        100 * target, 100 * measured, goal_mark(met))
                          : fmt::format("{:<44} {} {:>5.2f}x  {:>8.2f}x   {}\n", what, relation,
                                        target, measured, goal_mark(met));
    goals.push_back({{"goal", what}, {"relation", relation}, {"target", target},
                     {"measured", measured}, {"met", met}});
  };
  for (const CaseResult& r : results) {
    const bool demo = r.c.name() == kDemoCase;
    const bool small = r.c.preset == "small";
    if (r.python && (demo || small)) {
      goal(r.c.name() + ": tokens/s agora / python", ">=",
           demo ? kGoalRatioTinyDemo : kGoalRatioSmall,
           r.agora.median_tps() / r.python->median_tps(), false);
    }
    if (demo || small) {
      goal(r.c.name() + ": agora MFU", ">=", demo ? kGoalMfuTinyDemo : kGoalMfuSmall,
           mfu(r, r.agora), true);
    }
    if (r.python) {
      goal(r.c.name() + ": peak RSS agora / python", "<=", 1.0,
           r.agora.peak_rss_mb / r.python->peak_rss_mb, false);
    }
  }
  if (!goal_lines.empty()) {
    std::cout << "\ngoals (from the issues)                              target    measured\n"
              << goal_lines;
  }

  if (!o.json_path.empty()) {
    json out;
    out["benchmark"] = "trainer";
    out["nproc"] = nproc;
    out["threads"] = o.threads;
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
    out["faults_per_step"] = "minor page faults (ru_minflt) over the timed steps / timed steps";
    out["system_share"] = "ru_stime / (ru_utime + ru_stime) over the timed steps";
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
    out["agora_glibc_environment"] = kSystemMallocEnvironment;
    for (const CaseResult& r : results) {
      json p = {{"case", r.c.name()},
                {"preset", r.c.preset},
                {"batch", r.c.batch},
                {"micro_batch", r.c.micro_batch},
                {"seq_len", r.c.seq_len},
                {"parameters", r.config.num_parameters()},
                {"hidden_size", r.config.hidden_size},
                {"intermediate_size", r.config.intermediate_size},
                {"num_layers", r.config.num_layers},
                {"num_heads", r.config.num_heads},
                {"num_kv_heads", r.config.num_kv_heads},
                {"tie_embeddings", r.config.tie_embeddings},
                {"padded_vocab_size", r.config.padded_vocab_size()},
                {"warmup_steps", r.c.warmup},
                {"timed_steps_per_repeat", r.c.steps},
                {"tokens_per_step", r.c.tokens_per_step()},
                {"flops_per_token", flops_per_token(r.config)}};
      for (const Figures* f : r.rows()) p["results"].push_back(figures_json(*f, mfu(r, *f)));
      if (r.python) {
        p["ratio_tokens_per_s"] = r.agora.median_tps() / r.python->median_tps();
        p["ratio_peak_rss"] = r.agora.peak_rss_mb / r.python->peak_rss_mb;
      }
      if (r.python_mallopt) {
        p["ratio_tokens_per_s_vs_python_mallopt"] =
            r.agora.median_tps() / r.python_mallopt->median_tps();
      }
      if (r.agora_system) {
        p["ratio_tokens_per_s_vs_agora_glibc"] = r.agora.median_tps() / r.agora_system->median_tps();
      }
      out["cases"].push_back(p);
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
  CLI::App app{"Training throughput: agora's step against the same step in Python PyTorch"};
  Options o;
  app.add_option("--cases", o.cases,
                 "Comma-separated cases preset:BATCHxSEQ_LEN/MICRO_BATCH (tokens per step = "
                 "BATCH x SEQ_LEN, trained in micro-batches of MICRO_BATCH sequences)")
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "Vocabulary size (padded to 64 in the model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Threads (torch::set_num_threads) for every side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup,
                 "Untimed warm-up steps (default per preset, fewer for larger steps: tiny 5 at "
                 "8 x 64, small 2 at 8 x 256)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps,
                 "Timed steps per repeat (default per preset, fewer for larger steps: tiny 30 at "
                 "8 x 64, small 3 at 8 x 256)")
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
  app.add_flag("--no-system-malloc", o.no_system_malloc,
               "Skip the second agora run, with glibc's malloc defaults (AGORA_MALLOC=system)");
  app.add_option("--json", o.json_path, "Write all figures to this JSON file");
  app.add_option("--worker", o.worker, "(internal) run one measurement: agora or sgemm")
      ->check(CLI::IsMember({"agora", "sgemm"}))
      ->group("");
  app.add_option("--case", o.worker_case, "(internal) the worker's case")->group("");
  CLI11_PARSE(app, argc, argv);

  try {
    agora::tune_allocator_for_tensors();
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
