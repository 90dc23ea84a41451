// bench_payload: the bytes each synchronisation strategy puts on the wire per step, for each
// setting and model preset, and the ratio to a dense fp32 gradient (4 bytes per parameter).
//
// Strategies and settings:
//   DeMo               top-k 32 and 4, f32 or one-bit values, chunk 64; top-k 4 one-bit chunk 32
//   all-reduce AdamW   the gradient as dense fp32 or bf16, every step
//   DiLoCo             the pseudo-gradient as dense fp32, bf16 or int8 rows, once per round of H
//                      inner steps: the bytes of one sync, and amortised per step at H = 50, 500
//
// Sizes are real where the model is built (--measure, default small and gpt2-124m): the model's
// parameters get random gradients, each strategy's contribute() runs, and the figure is
// Contribution::bytes.size(), checked against encoded_size() of the strategy's own layout and of
// the layout computed from the ModelConfig. The other presets (1b) are never allocated: their
// sizes come from the same layouts (encoded_size() is data-independent), over parameter shapes
// computed from the ModelConfig the way Llama names them (checked against the real model for the
// measured presets). Each row says which ("measured" or "from layout").
//
// Next to DeMo's rows: the formula of docs/algorithms.md section 1.9, parameters / chunk^2 *
// (position bits per chunk / 8 + topk * value bytes), exact only when every dimension divides by
// the chunk, so a preset whose width gets smaller chunks (small's 288 = 6 x 48) shows the
// deviation.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/config/parameter_shapes.h"
#include "agora/core/allocator.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/model/llama.h"
#include "agora/obs/progress.h"
#include "agora/optim/adamw.h"
#include "agora/optim/chunking.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/optim/diloco.h"
#include "agora/optim/payload.h"
#include "agora/optim/payload_tensors.h"
#include "agora/optim/position_code.h"

namespace {

using nlohmann::json;

constexpr double kGoalRatio = 1500.0;  // top-k 4, one-bit, chunk 64 vs a dense fp32 gradient
constexpr int64_t kSeqLen = 256;       // the parameters do not depend on it
constexpr double kLr = 1e-3;
constexpr int64_t kInnerSteps[] = {50, 500};

struct Options {
  std::string presets = "small:8192,gpt2-124m:50257,1b:32000";
  std::string measure = "small,gpt2-124m";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t seed = 1234;
  std::string json_path;
};

// A parameter as the model declares it, without its data.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Llama's parameters (names and shapes, in named_parameters() order) from the config alone.
std::vector<Param> parameters_of(const agora::ModelConfig& c) {
  std::vector<Param> out;
  for (agora::ParameterShape& p : agora::parameter_shapes(c)) {
    out.push_back({std::move(p.name), std::move(p.shape)});
  }
  return out;
}

enum class Kind { kDemo, kAdamW, kDiLoCo };

struct Setting {
  Kind kind;
  std::string label;
  int64_t topk = 0, chunk = 0;
  bool one_bit = false;
  agora::ValueType type = agora::ValueType::kF32;
};

const std::vector<Setting>& settings() {
  using agora::ValueType;
  static const std::vector<Setting> all = {
      {Kind::kDemo, "topk 32, chunk 64, f32", 32, 64, false},
      {Kind::kDemo, "topk 32, chunk 64, one-bit", 32, 64, true},
      {Kind::kDemo, "topk 4, chunk 64, f32", 4, 64, false},
      {Kind::kDemo, "topk 4, chunk 64, one-bit (Psyche)", 4, 64, true},
      {Kind::kDemo, "topk 4, chunk 32, one-bit", 4, 32, true},
      {Kind::kAdamW, "fp32 gradient", 0, 0, false, ValueType::kF32},
      {Kind::kAdamW, "bf16 gradient", 0, 0, false, ValueType::kBF16},
      {Kind::kDiLoCo, "fp32", 0, 0, false, ValueType::kF32},
      {Kind::kDiLoCo, "bf16", 0, 0, false, ValueType::kBF16},
      {Kind::kDiLoCo, "int8 rows", 0, 0, false, ValueType::kInt8},
  };
  return all;
}

const char* strategy_name(Kind kind) {
  switch (kind) {
    case Kind::kDemo:
      return "DeMo";
    case Kind::kAdamW:
      return "all-reduce AdamW";
    case Kind::kDiLoCo:
      return "DiLoCo";
  }
  return "?";
}

agora::PayloadLayout layout_for(const Setting& s, const std::vector<Param>& params) {
  agora::PayloadLayout layout;
  layout.kind = s.kind == Kind::kDemo    ? agora::PayloadKind::kDemo
                : s.kind == Kind::kAdamW ? agora::PayloadKind::kGradient
                                         : agora::PayloadKind::kPseudoGradient;
  for (const Param& p : params) {
    switch (s.kind) {
      case Kind::kDemo:
        layout.tensors.push_back(agora::demo_tensor_layout(p.shape, s.chunk, s.topk, s.one_bit));
        break;
      case Kind::kAdamW:
        layout.tensors.push_back(agora::dense_layout(p.shape, s.type));
        break;
      case Kind::kDiLoCo:
        layout.tensors.push_back(agora::tensor_layout(p.shape, s.type));
        break;
    }
  }
  return layout;
}

// The size of docs/algorithms.md section 1.9, generalised from chunk 64: parameters / chunk^2 *
// (position bits per chunk / 8 + topk * value bytes), the position bits being payload version 2's
// code for a full chunk (44 at top-k 4 of 4096).
double demo_formula(int64_t parameters, const Setting& s) {
  const int64_t coefficients = s.chunk * s.chunk;
  const agora::PositionCode code(static_cast<uint64_t>(coefficients),
                                 static_cast<uint64_t>(s.topk));
  const double value_bytes = s.one_bit ? 1.0 / 8 : 4.0;
  return static_cast<double>(parameters) / static_cast<double>(coefficients) *
         (static_cast<double>(code.chunk_bits()) / 8 + static_cast<double>(s.topk) * value_bytes);
}

struct Measured {
  size_t bytes = 0;
  size_t strategy_layout_bytes = 0;  // encoded_size() of the strategy's own layout
  std::vector<std::string> warnings;
};

// One real contribution of `s` over `params` (whose .grad() are set).
Measured measure(const Setting& s, const std::vector<agora::NamedParameter>& params) {
  Measured m;
  switch (s.kind) {
    case Kind::kDemo: {
      agora::DemoOptions o;
      o.topk = s.topk;
      o.chunk = s.chunk;
      o.one_bit = s.one_bit;
      agora::DecoupledMomentum strategy(params, o);
      m.bytes = strategy.contribute({0, kLr, 1}).bytes.size();
      m.strategy_layout_bytes = agora::encoded_size(strategy.payload_layout());
      m.warnings = strategy.warnings();
      break;
    }
    case Kind::kAdamW: {
      agora::AdamWOptions o;
      o.gradient_type = s.type;
      agora::AdamWStrategy strategy(params, o);
      m.bytes = strategy.contribute({0, kLr, 2}).bytes.size();  // 2 peers: it sends its gradient
      m.strategy_layout_bytes = agora::encoded_size(strategy.layout());
      break;
    }
    case Kind::kDiLoCo: {
      agora::DiLoCoOptions o;
      o.inner_steps = kInnerSteps[0];
      o.pseudo_gradient_type = s.type;
      agora::DiLoCoStrategy strategy(params, o);
      // The round's last step sends the pseudo-gradient (its size does not depend on H).
      m.bytes = strategy.contribute({o.inner_steps - 1, kLr, 2}).bytes.size();
      m.strategy_layout_bytes = agora::encoded_size(strategy.layout());
      break;
    }
  }
  return m;
}

struct Row {
  std::string preset, strategy, setting, source;
  const Setting* setting_ref = nullptr;
  std::string per = "step";       // "step" or "sync"
  int64_t inner_steps = 0;        // DiLoCo amortised rows
  double bytes = 0;               // per step (or per sync)
  std::optional<double> formula;  // DeMo
  double per_parameter = 0, ratio = 0;
};

struct PresetResult {
  std::string name;
  agora::ModelConfig config;
  int64_t parameters = 0;
  bool measured = false;
  std::vector<std::string> warnings;  // "[setting] warning"
  double goal_ratio = 0;              // DeMo top-k 4, one-bit, chunk 64 vs a dense fp32 gradient
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int run(const Options& o) {
  torch::set_num_threads(o.threads);
  const std::vector<std::string> to_measure = split(o.measure);
  std::vector<Row> rows;
  std::vector<PresetResult> presets;
  std::vector<std::string> problems;

  for (const std::string& item : split(o.presets)) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      agora::fail("--presets item '{}' must be preset:vocab (e.g. gpt2-124m:50257)", item);
    }
    PresetResult r;
    r.name = item.substr(0, colon);
    r.config = agora::model_preset(r.name, std::stoll(item.substr(colon + 1)), kSeqLen);
    const std::vector<Param> shapes = parameters_of(r.config);
    for (const Param& p : shapes) r.parameters += p.numel();
    if (r.parameters != r.config.num_parameters()) {
      problems.push_back(
          fmt::format("{}: the computed shapes hold {} parameters, "
                      "ModelConfig::num_parameters() says {}",
                      r.name, r.parameters, r.config.num_parameters()));
    }
    r.measured = std::find(to_measure.begin(), to_measure.end(), r.name) != to_measure.end();

    // The real model, with random gradients, for the measured presets.
    agora::Llama model{nullptr};
    std::vector<agora::NamedParameter> params;
    if (r.measured) {
      std::cerr << fmt::format("[{}] building the model ({:.1f}M parameters)...\n", r.name,
                               r.parameters / 1e6);
      torch::manual_seed(o.seed);
      model = agora::Llama(r.config);
      size_t i = 0;
      for (auto& item : model->named_parameters()) {
        const std::vector<int64_t> shape = item.value().sizes().vec();
        if (i >= shapes.size() || shapes[i].name != item.key() || shapes[i].shape != shape) {
          problems.push_back(fmt::format(
              "{}: the model's parameter {} is {} [{}], the computed shapes say {}", r.name, i,
              item.key(), fmt::join(shape, ", "),
              i < shapes.size()
                  ? fmt::format("{} [{}]", shapes[i].name, fmt::join(shapes[i].shape, ", "))
                  : "nothing"));
        }
        item.value().mutable_grad() = torch::randn_like(item.value()) * 1e-3;
        params.push_back({item.key(), item.value(), item.value().dim() >= 2});
        ++i;
      }
      if (i != shapes.size()) {
        problems.push_back(
            fmt::format("{}: the model has {} parameters tensors, the computed "
                        "shapes {}",
                        r.name, i, shapes.size()));
      }
    }

    const double dense = 4.0 * static_cast<double>(r.parameters);
    const auto add_row = [&](const Setting& s, double bytes, const std::string& per,
                             int64_t inner_steps, std::string setting) {
      Row row;
      row.preset = r.name;
      row.strategy = strategy_name(s.kind);
      row.setting = std::move(setting);
      row.setting_ref = &s;
      row.source = r.measured ? "measured" : "from layout";
      row.per = per;
      row.inner_steps = inner_steps;
      row.bytes = bytes;
      if (s.kind == Kind::kDemo) row.formula = demo_formula(r.parameters, s);
      row.per_parameter = bytes / static_cast<double>(r.parameters);
      row.ratio = dense / bytes;
      rows.push_back(std::move(row));
    };

    std::set<std::string> seen_warnings;
    for (const Setting& s : settings()) {
      const size_t from_layout = agora::encoded_size(layout_for(s, shapes));
      size_t bytes = from_layout;
      std::vector<std::string> warnings;
      if (r.measured) {
        std::cerr << fmt::format("[{}] {} {}: contribute()...\n", r.name, strategy_name(s.kind),
                                 s.label);
        const Measured m = measure(s, params);
        bytes = m.bytes;
        warnings = m.warnings;
        if (m.bytes != m.strategy_layout_bytes || m.bytes != from_layout) {
          problems.push_back(fmt::format(
              "{} {} {}: contribute() gave {} bytes, encoded_size() of the strategy's layout {}, "
              "of the layout from the ModelConfig {}",
              r.name, strategy_name(s.kind), s.label, m.bytes, m.strategy_layout_bytes,
              from_layout));
        }
      } else if (s.kind == Kind::kDemo) {
        for (const Param& p : shapes) {
          if (auto w = agora::compression_warning(p.name, p.shape, s.chunk, s.topk)) {
            warnings.push_back(*w);
          }
        }
      }
      for (const std::string& w : warnings) {
        const std::string line = fmt::format("[chunk {}, topk {}] {}", s.chunk, s.topk, w);
        if (seen_warnings.insert(line).second) r.warnings.push_back(line);
      }
      const double b = static_cast<double>(bytes);
      if (s.kind == Kind::kDiLoCo) {
        add_row(s, b, "sync", 0, s.label + ", one sync");
        for (int64_t h : kInnerSteps) {
          add_row(s, b / static_cast<double>(h), "step", h,
                  fmt::format("{}, H={}, per step", s.label, h));
        }
      } else {
        add_row(s, b, "step", 0, s.label);
      }
      if (s.kind == Kind::kDemo && s.topk == 4 && s.one_bit && s.chunk == 64) {
        r.goal_ratio = dense / b;
      }
    }
    presets.push_back(std::move(r));
  }

  // The table.
  std::cout << fmt::format(
      "bench_payload: bytes on the wire per step (DiLoCo: per sync, and amortised per step), "
      "{} threads\n"
      "vs fp32 = a dense fp32 gradient (4 bytes x parameters) / the bytes; B/param = bytes / "
      "parameters\n"
      "formula = parameters / chunk^2 x (position bits per chunk / 8 + topk x value bytes) "
      "(docs/algorithms.md section 1.9; payload version 2 codes a chunk's positions in "
      "bit_width(C(chunk^2, topk) - 1) bits, 44 at top-k 4 of 64x64, or Elias-Fano past 64 bits), "
      "values 4 bytes f32, 1/8 one-bit\n"
      "measured = a real contribute() over the built model (equal to encoded_size() of its "
      "layout, checked); from layout = encoded_size() of the layout from the ModelConfig\n\n",
      o.threads);
  std::cout << fmt::format("{:<10} {:>8} {:<17} {:<36} {:>15} {:>10} {:>10} {:>12} {:>8} {:<11}\n",
                           "preset", "params", "strategy", "setting", "bytes", "B/param", "vs fp32",
                           "formula", "/formula", "source");
  std::string last_preset;
  for (const Row& row : rows) {
    if (!last_preset.empty() && row.preset != last_preset) std::cout << "\n";
    last_preset = row.preset;
    const PresetResult& p =
        *std::find_if(presets.begin(), presets.end(),
                      [&](const PresetResult& x) { return x.name == row.preset; });
    const bool whole = row.bytes == static_cast<double>(static_cast<int64_t>(row.bytes));
    std::cout << fmt::format(
        "{:<10} {:>7.2f}M {:<17} {:<36} {:>15} {:>10.5f} {:>9.1f}x {:>12} {:>8} {:<11}\n",
        row.preset, p.parameters / 1e6, row.strategy, row.setting,
        whole ? fmt::format("{}", static_cast<int64_t>(row.bytes))
              : fmt::format("{:.1f}", row.bytes),
        row.per_parameter, row.ratio, row.formula ? fmt::format("{:.0f}", *row.formula) : "-",
        row.formula ? fmt::format("{:.3f}", row.bytes / *row.formula) : "-", row.source);
  }

  std::cout
      << "\nDeMo compression warnings (DecoupledMomentum::warnings() / compression_warning())\n";
  for (const PresetResult& p : presets) {
    std::cout << fmt::format("{} (vocabulary {}, padded {}, hidden {}, intermediate {}): {}\n",
                             p.name, p.config.vocab_size, p.config.padded_vocab_size(),
                             p.config.hidden_size, p.config.intermediate_size,
                             p.warnings.empty() ? "none" : "");
    for (const std::string& w : p.warnings) std::cout << "  " << w << "\n";
  }

  std::cout << "\ngoals (from the issue)                               target     measured\n";
  json goal = json::object();
  for (const PresetResult& p : presets) {
    const double ratio = p.goal_ratio;
    const bool met = ratio >= kGoalRatio;
    std::cout << fmt::format("{:<52} >= {:.0f}x  {:>8.1f}x   {}  (fp32 gradient {}, payload {})\n",
                             p.name + ": DeMo topk 4, one-bit, chunk 64 vs fp32", kGoalRatio, ratio,
                             met ? "met" : "MISSED",
                             agora::format_bytes(4.0 * static_cast<double>(p.parameters)),
                             agora::format_bytes(4.0 * static_cast<double>(p.parameters) / ratio));
    goal[p.name] = {{"ratio", ratio}, {"met", met}};
  }

  for (const std::string& problem : problems) std::cout << "\n!!!!! " << problem << " !!!!!";
  if (!problems.empty()) std::cout << "\n";

  if (!o.json_path.empty()) {
    json out;
    out["benchmark"] = "payload";
    out["threads"] = o.threads;
    out["dense_fp32_gradient"] = "4 bytes x parameters";
    out["demo_formula"] =
        "parameters / chunk^2 * (position_bits_per_chunk / 8 + topk * value_bytes); chunk 64, "
        "top-k 4: (#params / 4096) * (44 / 8 + 4 * value_bytes)";
    out["consistent"] = problems.empty();
    out["problems"] = problems;
    for (const PresetResult& p : presets) {
      out["presets"].push_back({{"preset", p.name},
                                {"vocab_size", p.config.vocab_size},
                                {"padded_vocab_size", p.config.padded_vocab_size()},
                                {"hidden_size", p.config.hidden_size},
                                {"intermediate_size", p.config.intermediate_size},
                                {"num_layers", p.config.num_layers},
                                {"parameters", p.parameters},
                                {"dense_fp32_gradient_bytes", 4 * p.parameters},
                                {"source", p.measured ? "measured" : "from layout"},
                                {"warnings", p.warnings}});
    }
    for (const Row& row : rows) {
      const Setting& s = *row.setting_ref;
      json j = {
          {"preset", row.preset},
          {"strategy", row.strategy},
          {"setting", row.setting},
          {"value_type", s.kind == Kind::kDemo && s.one_bit ? "one_bit" : agora::to_string(s.type)},
          {"per", row.per},
          {"bytes", row.bytes == static_cast<double>(static_cast<int64_t>(row.bytes))
                        ? json(static_cast<int64_t>(row.bytes))
                        : json(row.bytes)},
          {"bytes_per_parameter", row.per_parameter},
          {"ratio_vs_fp32_gradient", row.ratio},
          {"source", row.source}};
      if (s.kind == Kind::kDemo) {
        j["topk"] = s.topk;
        j["chunk"] = s.chunk;
        j["formula_bytes"] = *row.formula;
        j["bytes_over_formula"] = row.bytes / *row.formula;
      }
      if (row.inner_steps > 0) j["inner_steps"] = row.inner_steps;
      out["rows"].push_back(j);
    }
    out["goals"] = {{"topk4_one_bit_chunk64_ratio_at_least_1500", goal}};
    const std::filesystem::path file(o.json_path);
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    agora::write_file_atomic(file, out.dump(2) + "\n");
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Bytes on the wire per step for DeMo, all-reduce AdamW and DiLoCo"};
  Options o;
  app.add_option("--presets", o.presets,
                 "Comma-separated preset:vocabulary pairs (the vocabulary is the tokenizer's; "
                 "the model pads it to a multiple of 64)")
      ->capture_default_str();
  app.add_option("--measure", o.measure,
                 "Presets to build and measure with real contribute() calls (the others are "
                 "computed from the payload layouts)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Threads (torch::set_num_threads)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the model and its random gradients")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Write all rows to this JSON file");
  CLI11_PARSE(app, argc, argv);
  try {
    agora::tune_allocator_for_tensors();
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "bench_payload: " << e.what() << "\n";
    return 1;
  }
}
