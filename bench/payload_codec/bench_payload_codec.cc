// bench_payload_codec: payload version 2 (positions coded by position_code.h) against version 1
// (fixed-width u8/u16/u32 positions) on DeMo's real layouts: bytes per step and the time to
// encode and decode one payload. Torch-free: the layouts come from the ModelConfig's parameter
// shapes, the payloads carry random positions and values (sizes do not depend on the data).
//
// Version 2's figures are the library's: encoded_size() of the layout, encode_payload() and
// decode_payload() with the expected layout (what a peer does with a received payload). Version
// 1 is no longer in the library; kV1 below is a faithful copy of its codec for dct_topk tensors
// (payload.cc before version 2: the same reads, loops and checks), so both sides do equal work
// apart from the position code.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/config/parameter_shapes.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/little_endian.h"
#include "agora/optim/chunking.h"
#include "agora/optim/payload.h"
#include "agora/optim/position_code.h"

namespace {

using nlohmann::json;

constexpr double kGoalRatio = 2600.0;  // gpt2-124m, top-k 4, one-bit, chunk 64 vs fp32
constexpr int64_t kSeqLen = 256;

struct Setting {
  std::string label;
  int64_t topk, chunk;
  bool one_bit;
};

const std::vector<Setting> kSettings = {
    {"topk 32, chunk 64, f32", 32, 64, false},  {"topk 32, chunk 64, one-bit", 32, 64, true},
    {"topk 4, chunk 64, f32", 4, 64, false},    {"topk 4, chunk 64, one-bit (Psyche)", 4, 64, true},
    {"topk 4, chunk 32, one-bit", 4, 32, true},
};

// ---------------------------------------------------------------------------------------------
// Version 1, dct_topk only

namespace v1 {

uint64_t position_bytes(int64_t chunk_size) {
  return chunk_size <= 256 ? 1 : chunk_size <= 65536 ? 2 : 4;
}

uint64_t value_bytes(agora::ValueType type, uint64_t n) {
  return type == agora::ValueType::kF32    ? 4 * n
         : type == agora::ValueType::kBF16 ? 2 * n
                                           : (n + 7) / 8;
}

uint64_t encoded_size(const agora::PayloadLayout& layout) {
  uint64_t size = 20;
  for (const agora::TensorLayout& l : layout.tensors) {
    const auto n = static_cast<uint64_t>(l.value_count());
    size += 4 + 4 * l.shape.size() + 12 + n * position_bytes(l.chunk_size()) +
            value_bytes(l.value_type, n);
  }
  return size;
}

std::string encode(const agora::Payload& p) {
  std::string out = "AGPL";
  agora::append_le(out, 1, 2);
  agora::append_le(out, static_cast<uint8_t>(p.kind), 1);
  agora::append_le(out, 0, 1);
  agora::append_le(out, p.step, 8);
  agora::append_le(out, p.tensors.size(), 4);
  for (const agora::TensorPayload& t : p.tensors) {
    const agora::TensorLayout& l = t.layout;
    agora::append_le(out, l.shape.size(), 1);
    agora::append_le(out, static_cast<uint8_t>(l.encoding), 1);
    agora::append_le(out, static_cast<uint8_t>(l.value_type), 1);
    agora::append_le(out, 0, 1);
    for (const int64_t d : l.shape) agora::append_le(out, static_cast<uint64_t>(d), 4);
    agora::append_le(out, static_cast<uint64_t>(l.chunk_rows), 4);
    agora::append_le(out, static_cast<uint64_t>(l.chunk_cols), 4);
    agora::append_le(out, static_cast<uint64_t>(l.topk), 4);
    const uint64_t width = position_bytes(l.chunk_size());
    for (const uint32_t q : t.positions) agora::append_le(out, q, width);
    if (l.value_type == agora::ValueType::kF32) {
      for (const float v : t.values) agora::append_le(out, std::bit_cast<uint32_t>(v), 4);
    } else {
      for (size_t begin = 0; begin < t.values.size(); begin += 8) {
        uint8_t byte = 0;
        for (size_t j = 0; j < 8 && begin + j < t.values.size(); ++j) {
          if (t.values[begin + j] < 0) byte |= static_cast<uint8_t>(1u << j);
        }
        out.push_back(static_cast<char>(byte));
      }
    }
  }
  return out;
}

// The old decode's work for a dct_topk payload with an expected layout: bounds-checked reads,
// fixed-width positions, the range and order check, values with the finiteness check.
agora::Payload decode(std::string_view bytes, const agora::PayloadLayout& expected) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t at = 0;
  const auto take = [&](uint64_t n) {
    if (n > bytes.size() - at) agora::fail("v1: truncated at {}", at);
    const uint8_t* p = data + at;
    at += n;
    return p;
  };
  if (std::string_view(bytes.data(), std::min<size_t>(4, bytes.size())) != "AGPL") {
    agora::fail("v1: magic");
  }
  take(4);
  if (agora::load_le(take(2), 2) != 1) agora::fail("v1: version");
  agora::Payload payload;
  payload.kind = static_cast<agora::PayloadKind>(*take(1));
  take(1);
  payload.step = agora::load_le64(take(8));
  const uint64_t count = agora::load_le32(take(4));
  if (count != expected.tensors.size()) agora::fail("v1: tensor count");
  payload.tensors.resize(count);
  for (size_t i = 0; i < count; ++i) {
    agora::TensorPayload& t = payload.tensors[i];
    agora::TensorLayout& l = t.layout;
    const uint64_t ndim = *take(1);
    l.encoding = static_cast<agora::TensorEncoding>(*take(1));
    l.value_type = static_cast<agora::ValueType>(*take(1));
    take(1);
    const uint8_t* dims = take(4 * ndim);
    for (size_t d = 0; d < ndim; ++d) l.shape.push_back(agora::load_le32(dims + 4 * d));
    l.chunk_rows = agora::load_le32(take(4));
    l.chunk_cols = agora::load_le32(take(4));
    l.topk = agora::load_le32(take(4));
    if (!(l == expected.tensors[i])) agora::fail("v1: tensor {} layout", i);
    const auto n = static_cast<size_t>(l.value_count());
    const uint64_t width = position_bytes(l.chunk_size());
    const uint8_t* p = take(n * width + value_bytes(l.value_type, n));
    t.positions.resize(n);
    for (size_t j = 0; j < n; ++j) t.positions[j] = agora::load_le(p + j * width, width);
    for (int64_t c = 0; c < l.num_chunks(); ++c) {
      const uint32_t* q = t.positions.data() + c * l.topk;
      for (int64_t j = 0; j < l.topk; ++j) {
        if (q[j] >= l.chunk_size()) agora::fail("v1: position {} out of range", q[j]);
        if (j > 0 && q[j] <= q[j - 1]) agora::fail("v1: positions not ascending");
      }
    }
    const uint8_t* v = p + n * width;
    t.values.resize(n);
    if (l.value_type == agora::ValueType::kF32) {
      for (size_t j = 0; j < n; ++j)
        t.values[j] = std::bit_cast<float>(agora::load_le32(v + 4 * j));
    } else {
      for (size_t j = 0; j < n; ++j) t.values[j] = (v[j / 8] >> (j % 8)) & 1 ? -1.0f : 1.0f;
      if (n % 8 != 0 && (v[n / 8] >> (n % 8)) != 0) agora::fail("v1: padding");
    }
    for (size_t j = 0; j < n; ++j) {
      if (!std::isfinite(t.values[j])) agora::fail("v1: value {}", j);
    }
  }
  if (at != bytes.size()) agora::fail("v1: trailing bytes");
  return payload;
}

}  // namespace v1

// ---------------------------------------------------------------------------------------------

agora::PayloadLayout layout_for(const std::vector<agora::ParameterShape>& params,
                                const Setting& s) {
  agora::PayloadLayout layout{agora::PayloadKind::kDemo, {}};
  for (const agora::ParameterShape& p : params) {
    layout.tensors.push_back(agora::demo_tensor_layout(p.shape, s.chunk, s.topk, s.one_bit));
  }
  return layout;
}

agora::Payload random_payload(const agora::PayloadLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  agora::Payload p{layout.kind, 1, {}};
  std::vector<uint32_t> set;
  for (const agora::TensorLayout& l : layout.tensors) {
    agora::TensorPayload t;
    t.layout = l;
    const auto k = static_cast<size_t>(l.topk);
    for (int64_t c = 0; c < l.num_chunks(); ++c) {
      set.clear();
      while (set.size() < k) {
        const auto q = static_cast<uint32_t>(rng() % static_cast<uint64_t>(l.chunk_size()));
        if (std::find(set.begin(), set.end(), q) == set.end()) set.push_back(q);
      }
      std::sort(set.begin(), set.end());
      t.positions.insert(t.positions.end(), set.begin(), set.end());
    }
    for (int64_t i = 0; i < l.value_count(); ++i) {
      const float v = normal(rng);
      t.values.push_back(l.value_type == agora::ValueType::kOneBit ? (v < 0 ? -1.0f : 1.0f) : v);
    }
    p.tensors.push_back(std::move(t));
  }
  return p;
}

// This thread's CPU time: on a shared machine, wall time counts other processes' turns.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// The medians of `repeats` timings of a and of b, taken alternately so that both see the same
// machine (other processes' load, frequency) over the run.
template <class A, class B>
std::pair<double, double> median_ms(int repeats, A&& a, B&& b) {
  a();  // warm: caches, the binomial table, the allocator
  b();
  std::vector<double> ta, tb;
  for (int r = 0; r < repeats; ++r) {
    double start = thread_cpu_ms();
    a();
    ta.push_back(thread_cpu_ms() - start);
    start = thread_cpu_ms();
    b();
    tb.push_back(thread_cpu_ms() - start);
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

struct Row {
  std::string preset, setting;
  int64_t parameters = 0;
  uint64_t v1_bytes = 0, v2_bytes = 0;
  bool timed = false;
  double v1_encode_ms = 0, v2_encode_ms = 0, v1_decode_ms = 0, v2_decode_ms = 0;
};

struct Options {
  std::string presets = "small:8192,gpt2-124m:50257,1b:32000";
  std::string time = "gpt2-124m";
  int repeats = 31;
  uint64_t seed = 1234;
  std::string json_path;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

int run(const Options& o) {
  const std::vector<std::string> to_time = split(o.time);
  std::vector<Row> rows;
  std::vector<std::string> problems;
  double goal_ratio = 0;
  for (const std::string& item : split(o.presets)) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) agora::fail("--presets item '{}' must be preset:vocab", item);
    const std::string name = item.substr(0, colon);
    const agora::ModelConfig config =
        agora::model_preset(name, std::stoll(item.substr(colon + 1)), kSeqLen);
    const std::vector<agora::ParameterShape> params = agora::parameter_shapes(config);
    const bool timed = std::find(to_time.begin(), to_time.end(), name) != to_time.end();
    for (const Setting& s : kSettings) {
      Row row{name, s.label, config.num_parameters()};
      const agora::PayloadLayout layout = layout_for(params, s);
      row.v1_bytes = v1::encoded_size(layout);
      row.v2_bytes = agora::encoded_size(layout);
      if (name == "gpt2-124m" && s.topk == 4 && s.chunk == 64 && s.one_bit) {
        goal_ratio = 4.0 * static_cast<double>(row.parameters) / static_cast<double>(row.v2_bytes);
      }
      if (timed) {
        std::cerr << fmt::format("[{}] {}: timing {} repeats...\n", name, s.label, o.repeats);
        const agora::Payload p = random_payload(layout, o.seed);
        const std::string b1 = v1::encode(p), b2 = agora::encode_payload(p);
        if (b1.size() != row.v1_bytes || b2.size() != row.v2_bytes) {
          problems.push_back(fmt::format("{} {}: encoded {} / {} bytes, layouts say {} / {}", name,
                                         s.label, b1.size(), b2.size(), row.v1_bytes,
                                         row.v2_bytes));
        }
        if (!(v1::decode(b1, layout) == p) || !(agora::decode_payload(b2, layout) == p)) {
          problems.push_back(
              fmt::format("{} {}: a decode differs from the payload", name, s.label));
        }
        row.timed = true;
        std::tie(row.v1_encode_ms, row.v2_encode_ms) = median_ms(
            o.repeats, [&] { return v1::encode(p).size(); },
            [&] { return agora::encode_payload(p).size(); });
        std::tie(row.v1_decode_ms, row.v2_decode_ms) = median_ms(
            o.repeats, [&] { return v1::decode(b1, layout).step; },
            [&] { return agora::decode_payload(b2, layout).step; });
      }
      rows.push_back(row);
    }
  }

  std::cout << fmt::format(
      "bench_payload_codec: DeMo payload bytes per step, version 1 (fixed-width positions) vs "
      "version 2 (position_code.h), and the medians of {} encodes and decodes of one payload, v1 "
      "and v2 alternating "
      "(decode with the expected layout, one thread's CPU time, random contents)\n"
      "vs fp32 = 4 bytes x parameters / bytes\n\n",
      o.repeats);
  std::cout << fmt::format(
      "{:<10} {:<36} {:>12} {:>12} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}\n", "preset",
      "setting", "v1 bytes", "v2 bytes", "v1 fp32x", "v2 fp32x", "v1/v2", "v1 enc ms", "v2 enc ms",
      "v1 dec ms", "v2 dec ms");
  json out_rows = json::array();
  for (const Row& r : rows) {
    const double dense = 4.0 * static_cast<double>(r.parameters);
    const auto ms = [&](double v) { return r.timed ? fmt::format("{:.2f}", v) : std::string("-"); };
    std::cout << fmt::format(
        "{:<10} {:<36} {:>12} {:>12} {:>8.0f}x {:>8.0f}x {:>7.3f} {:>9} {:>9} {:>9} {:>9}\n",
        r.preset, r.setting, r.v1_bytes, r.v2_bytes, dense / static_cast<double>(r.v1_bytes),
        dense / static_cast<double>(r.v2_bytes),
        static_cast<double>(r.v1_bytes) / static_cast<double>(r.v2_bytes), ms(r.v1_encode_ms),
        ms(r.v2_encode_ms), ms(r.v1_decode_ms), ms(r.v2_decode_ms));
    json j = {{"preset", r.preset},
              {"setting", r.setting},
              {"parameters", r.parameters},
              {"v1_bytes", r.v1_bytes},
              {"v2_bytes", r.v2_bytes},
              {"v1_ratio_vs_fp32", dense / static_cast<double>(r.v1_bytes)},
              {"v2_ratio_vs_fp32", dense / static_cast<double>(r.v2_bytes)}};
    if (r.timed) {
      j["v1_encode_ms"] = r.v1_encode_ms;
      j["v2_encode_ms"] = r.v2_encode_ms;
      j["v1_decode_ms"] = r.v1_decode_ms;
      j["v2_decode_ms"] = r.v2_decode_ms;
    }
    out_rows.push_back(j);
  }
  const bool met = goal_ratio >= kGoalRatio;
  std::cout << fmt::format(
      "\ngoal: gpt2-124m, top-k 4 one-bit chunk 64, >= {:.0f}x fp32: {:.1f}x {}\n", kGoalRatio,
      goal_ratio,
      goal_ratio == 0 ? "(not run)"
      : met           ? "met"
                      : "MISSED");
  for (const std::string& problem : problems) std::cout << "!!!!! " << problem << "\n";
  if (!o.json_path.empty()) {
    json out = {{"benchmark", "payload_codec"},
                {"repeats", o.repeats},
                {"rows", out_rows},
                {"goal",
                 {{"gpt2_124m_topk4_one_bit_chunk64_ratio_at_least", kGoalRatio},
                  {"measured", goal_ratio},
                  {"met", met}}},
                {"consistent", problems.empty()},
                {"problems", problems}};
    const std::filesystem::path file(o.json_path);
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    agora::write_file_atomic(file, out.dump(2) + "\n");
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Payload version 2 against version 1: bytes, encode and decode time"};
  Options o;
  app.add_option("--presets", o.presets, "Comma-separated preset:vocabulary pairs")
      ->capture_default_str();
  app.add_option("--time", o.time, "Presets whose payloads are encoded and decoded, timed")
      ->capture_default_str();
  app.add_option("--repeats", o.repeats, "Timed repeats per figure (the median is shown)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the random contents")->capture_default_str();
  app.add_option("--json", o.json_path, "Write all rows to this JSON file");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "bench_payload_codec: " << e.what() << "\n";
    return 1;
  }
}
