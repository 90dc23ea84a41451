// agora inspect: what a file the system wrote holds, as JSON. `agora inspect payload FILE` shows
// one peer's contribution to a step: its tensors, their encodings, how densely they were sent and
// what the values look like.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/optim/payload.h"
#include "agora/optim/position_code.h"
#include "commands.h"

namespace agora::cli {
namespace {

using json = nlohmann::ordered_json;

// A statistic at float precision: the shortest decimal that reads back as the same float, so
// "0.01" rather than "0.009999999776482582".
double shortest(double v) {
  return std::stod(fmt::format("{}", static_cast<float>(v)));
}

// The statistics of the values a tensor carries (dequantized for int8_rows).
json value_stats(const TensorPayload& t) {
  std::vector<float> values = t.values;
  if (t.layout.encoding == TensorEncoding::kInt8Rows) {
    const size_t row = static_cast<size_t>(t.layout.shape.back());
    for (size_t i = 0; i < t.quantized.size(); ++i) {
      values.push_back(static_cast<float>(t.quantized[i]) * t.scales[i / row]);
    }
  }
  double min = std::numeric_limits<double>::infinity(), max = -min;
  double sum_abs = 0, sum_squares = 0;
  size_t negative = 0;
  for (const float v : values) {
    min = std::min<double>(min, v);
    max = std::max<double>(max, v);
    sum_abs += std::abs(v);
    sum_squares += double{v} * v;
    negative += v < 0;
  }
  const double n = static_cast<double>(values.size());  // >= 1: every layout holds a value
  return {{"values", values.size()},
          {"min", shortest(min)},
          {"max", shortest(max)},
          {"mean_abs", shortest(sum_abs / n)},
          {"rms", shortest(std::sqrt(sum_squares / n))},
          {"negative_fraction", negative / n}};
}

json inspect_payload(const std::string& path) {
  const std::string bytes = read_file(path);
  Payload payload;
  try {
    payload = decode_payload(bytes);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  const size_t header_bytes = encoded_size({payload.kind, {}});
  json tensors = json::array();
  int64_t parameters = 0, values = 0;
  for (size_t i = 0; i < payload.tensors.size(); ++i) {
    const TensorPayload& t = payload.tensors[i];
    const TensorLayout& l = t.layout;
    json entry = {{"index", i},
                  {"shape", l.shape},
                  {"encoding", to_string(l.encoding)},
                  {"value_type", to_string(l.value_type)},
                  {"bytes", encoded_size({payload.kind, {l}}) - header_bytes}};
    if (l.encoding == TensorEncoding::kDctTopK) {
      entry["chunk"] = {l.chunk_rows, l.chunk_cols};
      entry["chunks"] = l.num_chunks();
      entry["topk"] = l.topk;
      entry["density"] = static_cast<double>(l.topk) / static_cast<double>(l.chunk_size());
      const PositionCode code(static_cast<uint64_t>(l.chunk_size()), static_cast<uint64_t>(l.topk));
      entry["position_code"] = code.kind() == PositionCode::Kind::kRank ? "rank" : "elias_fano";
      entry["position_bits_per_chunk"] = code.chunk_bits();
    }
    entry.update(value_stats(t));
    if (l.encoding == TensorEncoding::kInt8Rows) {
      const auto [lo, hi] = std::minmax_element(t.scales.begin(), t.scales.end());
      entry["rows"] = l.rows();
      entry["scale_min"] = shortest(*lo);
      entry["scale_max"] = shortest(*hi);
    }
    tensors.push_back(std::move(entry));
    parameters += l.numel();
    values += l.value_count();
  }
  const double size = static_cast<double>(bytes.size());
  json totals = {{"tensors", payload.tensors.size()},
                 {"parameters", parameters},
                 {"values", values},
                 {"bytes_per_parameter", nullptr},
                 {"ratio_to_fp32", nullptr}};
  if (parameters > 0) {
    totals["bytes_per_parameter"] = size / static_cast<double>(parameters);
    totals["ratio_to_fp32"] = 4.0 * static_cast<double>(parameters) / size;
  }
  return {{"file", path},
          {"bytes", bytes.size()},
          {"version", kPayloadVersion},
          {"kind", to_string(payload.kind)},
          {"step", payload.step},
          {"tensors", std::move(tensors)},
          {"totals", std::move(totals)}};
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show what a file agora wrote holds, as JSON");
  cmd->require_subcommand(1);

  auto file = std::make_shared<std::string>();
  auto* payload = cmd->add_subcommand(
      "payload", "A peer's contribution to a step: tensors, encodings, density, value statistics");
  payload->add_option("file", *file, "An encoded payload")->required();
  payload->callback([file] { fmt::print("{}\n", inspect_payload(*file).dump(2)); });
}

}  // namespace agora::cli
