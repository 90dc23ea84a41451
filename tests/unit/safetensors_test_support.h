// Shared by the safetensors tests: a temporary folder per test, and test tensors whose element i
// is a simple function of the dtype and i, computed the same way in C++ and in the Python scripts
// of safetensors_python_test.cc, and exact in every dtype used.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agora/tensor/safetensors.h"
#include "test_support.h"

namespace agora {
namespace safetensors_test {

namespace fs = std::filesystem;

class SafetensorsTest : public agora::testing::TempDirTest {};

// ---------------------------------------------------------------------------------------------
// Test values (the same formula as value() in safetensors_python_test.cc's scripts).

inline double expected_value(DType dtype, uint64_t i) {
  const double base = static_cast<double>(static_cast<int64_t>(i * 37 % 200) - 100);
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
    case DType::kF64:
      return (static_cast<double>(i) - 3) * 0.5;
    case DType::kI8:
      return base;
    case DType::kI16:
      return base * 100;
    case DType::kI32:
      return base * 100000;
    case DType::kI64:
      return base * 1e12;
    case DType::kU8:
      return static_cast<double>(i * 37 % 256);
    case DType::kBool:
      return i % 3 == 0 ? 1 : 0;
    default:
      ADD_FAILURE() << "no test values for " << dtype_name(dtype);
      return 0;
  }
}

// Half precision by hand for the exact values above (normal numbers and zero).
inline uint16_t encode_f16(double v) {
  if (v == 0) return 0;
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const auto mantissa = static_cast<uint16_t>((2 * m - 1) * 1024);
  return static_cast<uint16_t>(sign | (e + 14) << 10 | mantissa);
}

inline double decode_f16(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}

template <typename T>
inline void put(T v, uint8_t* out) {
  std::memcpy(out, &v, sizeof(T));
}

template <typename T>
inline T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline void encode(DType dtype, double v, uint8_t* out) {
  switch (dtype) {
    case DType::kF16:
      return put(encode_f16(v), out);
    case DType::kBF16:
      return put(static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16), out);
    case DType::kF32:
      return put(static_cast<float>(v), out);
    case DType::kF64:
      return put(v, out);
    case DType::kI8:
      return put(static_cast<int8_t>(v), out);
    case DType::kI16:
      return put(static_cast<int16_t>(v), out);
    case DType::kI32:
      return put(static_cast<int32_t>(v), out);
    case DType::kI64:
      return put(static_cast<int64_t>(v), out);
    case DType::kU8:
      return put(static_cast<uint8_t>(v), out);
    case DType::kBool:
      return put(static_cast<uint8_t>(v), out);
    default:
      ADD_FAILURE() << "cannot encode " << dtype_name(dtype);
  }
}

inline double decode(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kF16:
      return decode_f16(get<uint16_t>(p));
    case DType::kBF16:
      return std::bit_cast<float>(uint32_t{get<uint16_t>(p)} << 16);
    case DType::kF32:
      return get<float>(p);
    case DType::kF64:
      return get<double>(p);
    case DType::kI8:
      return get<int8_t>(p);
    case DType::kI16:
      return get<int16_t>(p);
    case DType::kI32:
      return get<int32_t>(p);
    case DType::kI64:
      return static_cast<double>(get<int64_t>(p));
    case DType::kU8:
      return get<uint8_t>(p);
    case DType::kBool:
      return get<uint8_t>(p);
    default:
      ADD_FAILURE() << "cannot decode " << dtype_name(dtype);
      return 0;
  }
}

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

inline uint64_t count_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

inline std::vector<uint8_t> make_bytes(const Spec& spec) {
  const uint64_t n = count_of(spec.shape);
  std::vector<uint8_t> bytes(n * dtype_size(spec.dtype));
  for (uint64_t i = 0; i < n; ++i) {
    encode(spec.dtype, expected_value(spec.dtype, i), bytes.data() + i * dtype_size(spec.dtype));
  }
  return bytes;
}

// Checks that `bytes` hold the test values of `spec`.
inline void expect_values(const Spec& spec, std::span<const uint8_t> bytes) {
  const uint64_t n = count_of(spec.shape);
  ASSERT_EQ(bytes.size(), n * dtype_size(spec.dtype)) << spec.name;
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(decode(spec.dtype, bytes.data() + i * dtype_size(spec.dtype)),
              expected_value(spec.dtype, i))
        << spec.name << " element " << i;
  }
}

// Tensors of every dtype agora writes in checkpoints, plus a scalar and a zero-size tensor.
inline std::vector<Spec> sample_specs() {
  return {
      {"model.embed_tokens.weight", DType::kF32, {2, 3}},
      {"f64", DType::kF64, {4}},
      {"f16", DType::kF16, {3, 2}},
      {"bf16", DType::kBF16, {5}},
      {"i64", DType::kI64, {2, 2}},
      {"i32", DType::kI32, {3}},
      {"i16", DType::kI16, {2}},
      {"i8", DType::kI8, {7}},
      {"u8", DType::kU8, {1, 1, 3}},
      {"bool", DType::kBool, {4}},
      {"scalar", DType::kF32, {}},
      {"empty", DType::kF32, {0, 3}},
  };
}

inline const std::map<std::string, std::string> kMetadata = {{"format", "pt"},
                                                             {"agora", "step 7, ü"}};

inline void write_specs(const fs::path& path, const std::vector<Spec>& specs,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<uint8_t>> buffers;
  for (const Spec& s : specs) buffers.push_back(make_bytes(s));
  std::vector<TensorView> views;
  for (size_t i = 0; i < specs.size(); ++i) {
    views.push_back({specs[i].name, specs[i].dtype, specs[i].shape, buffers[i]});
  }
  write_safetensors(path, views, metadata);
}

inline std::string specs_json(const std::vector<Spec>& specs) {
  nlohmann::json out = nlohmann::json::array();
  for (const Spec& s : specs) out.push_back({s.name, dtype_name(s.dtype), s.shape});
  return out.dump();
}

}  // namespace safetensors_test
}  // namespace agora
