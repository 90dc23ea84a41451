// write_safetensors() and safetensors_header_bytes(): see safetensors.h for the promises.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/little_endian.h"
#include "agora/tensor/safetensors.h"

namespace agora {
namespace {

// `text` as a JSON string literal. nlohmann escapes it and refuses text that is not UTF-8 (the
// reference's readers would refuse the header).
std::string json_string(const std::string& text, std::string_view what) {
  try {
    return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception&) {
    fail("safetensors writer: {} is not valid UTF-8; names and metadata must be UTF-8 text", what);
  }
}

// Checks one tensor and returns its size in bytes.
uint64_t checked_size(const TensorView& t) {
  if (t.shape.size() > kSafetensorsMaxRank) {
    fail("safetensors writer: tensor \"{}\" has {} dimensions; at most {} are allowed", t.name,
         t.shape.size(), kSafetensorsMaxRank);
  }
  bool zero = false;
  for (const int64_t d : t.shape) {
    if (d < 0) {
      fail("safetensors writer: tensor \"{}\" has the dimension {}; dimensions cannot be negative",
           t.name, d);
    }
    zero = zero || d == 0;
  }
  uint64_t n = zero ? 0 : 1;
  for (const int64_t d : t.shape) {
    if (zero) break;
    const uint64_t u = static_cast<uint64_t>(d);
    if (n > std::numeric_limits<uint64_t>::max() / u / dtype_size(t.dtype)) {
      fail("safetensors writer: tensor \"{}\" has more bytes than 2^64", t.name);
    }
    n *= u;
  }
  const uint64_t bytes = n * dtype_size(t.dtype);
  if (bytes != t.bytes.size()) {
    fail(
        "safetensors writer: tensor \"{}\" has {} elements of {} ({} bytes) but {} bytes were "
        "given",
        t.name, n, dtype_name(t.dtype), bytes, t.bytes.size());
  }
  return bytes;
}

}  // namespace

std::string safetensors_header_bytes(const std::vector<TensorView>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  // Written by hand rather than through a JSON object so the key order is the caller's and the
  // cost is linear in the number of tensors. The fields follow the reference's order.
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) json += ',';
      first = false;
      json += json_string(key, "a metadata key");
      json += ':';
      json += json_string(value, fmt::format("the value of metadata key {}", json_string(key, "")));
    }
    json += '}';
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__") {
      fail("safetensors writer: \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!names.insert(t.name).second) {
      fail("safetensors writer: two tensors are named \"{}\"; names must be unique", t.name);
    }
    const uint64_t size = checked_size(t);
    if (json.size() > 1) json += ',';
    json += json_string(t.name, "a tensor name");
    json += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                        dtype_name(t.dtype), fmt::join(t.shape, ","), offset, offset + size);
    offset += size;
  }
  json += '}';
  // Spaces after the JSON, so the data section (at 8 + the header length) is 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kSafetensorsMaxHeaderBytes) {
    fail(
        "safetensors writer: the header would have {} bytes, above the limit of {} that readers "
        "accept; write fewer tensors per file",
        json.size(), kSafetensorsMaxHeaderBytes);
  }
  std::string out;
  append_le(out, json.size(), 8);
  return out + json;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header_bytes(tensors, metadata);
  AtomicFile file(path);
  file.append(header);
  // Straight from the caller's memory: a model is never copied whole.
  for (const TensorView& t : tensors) file.append(t.bytes.data(), t.bytes.size());
  file.commit();
}

}  // namespace agora
