#include "agora/tensor/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"

namespace agora {

// Tensor bytes are handed out and written as they lie in memory; that is the format's byte order
// only on a little-endian host.
static_assert(std::endian::native == std::endian::little,
              "safetensors bytes are little-endian; agora reads and writes them as they are");

namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, 17> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1},
    {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E8M0, "F8_E8M0", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kC64, "C64", 8},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
}};

// Types of the format that agora deliberately does not read: their elements are not whole bytes.
constexpr std::array<std::string_view, 3> kSubByteDTypes = {"F4", "F6_E2M3", "F6_E3M2"};

const DTypeEntry& entry_of(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  fail("unknown DType value {}", static_cast<int>(dtype));
}

std::string allowed_dtypes() {
  std::string out;
  for (const DTypeEntry& e : kDTypes) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

// Text from a file, fit for an error message: control bytes escaped, cut after `max` bytes (at a
// UTF-8 character boundary), so a hostile name cannot flood a log or break its lines.
std::string printable(std::string_view text, size_t max = 80) {
  size_t cut = std::min(text.size(), max);
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) {
    --cut;
  }
  std::string out;
  for (size_t i = 0; i < cut; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string quote_text(std::string_view text) {
  return "\"" + printable(text) + "\"";
}

// The product of `shape`, or nullopt when it does not fit 64 bits. Zero wins over overflow: a
// tensor with a zero dimension has no elements however large the others are.
std::optional<uint64_t> element_count(const std::vector<int64_t>& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = 1;
  for (const int64_t d : shape) {
    const uint64_t u = static_cast<uint64_t>(d);
    if (d < 0 || n > std::numeric_limits<uint64_t>::max() / u) return std::nullopt;
    n *= u;
  }
  return n;
}

// The byte size of a tensor of `shape` and `dtype`, or nullopt on overflow.
std::optional<uint64_t> byte_count(const std::vector<int64_t>& shape, DType dtype) {
  const std::optional<uint64_t> n = element_count(shape);
  const uint64_t size = dtype_size(dtype);
  if (!n || *n > std::numeric_limits<uint64_t>::max() / size) return std::nullopt;
  return *n * size;
}

// Receives the header's JSON as a stream of events (nlohmann's SAX interface) and checks the
// structure as it goes. Building a DOM first would hide duplicate keys (nlohmann keeps the last)
// and would let a deeply nested or huge header allocate before anything is checked; here the
// first event that does not fit the expected shape stops the parse.
class HeaderHandler {
 public:
  using Json = nlohmann::json;

  explicit HeaderHandler(uint64_t data_size) : data_size_(data_size) {}

  std::vector<TensorInfo>& tensors() { return tensors_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::string& error() const { return error_; }

  // --- the SAX interface ---
  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(Json::number_integer_t v) {
    // nlohmann reports non-negative integers through number_unsigned, so `v` is negative here.
    if (state_ == State::kShape) {
      return reject("tensor {}: shape has the dimension {}; dimensions cannot be negative",
                    quote_text(entry_.name), v);
    }
    if (state_ == State::kOffsets) {
      return reject("tensor {}: data_offsets has {}; offsets cannot be negative",
                    quote_text(entry_.name), v);
    }
    return value("a number");
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (state_ == State::kShape) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return reject("tensor {}: shape has the dimension {}, above the limit of 2^63 - 1",
                      quote_text(entry_.name), v);
      }
      if (entry_.shape.size() == kSafetensorsMaxRank) {
        return reject("tensor {}: shape has more than {} dimensions", quote_text(entry_.name),
                      kSafetensorsMaxRank);
      }
      entry_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (num_offsets_ == 2) {
        return reject("tensor {}: data_offsets has more than two numbers; it must be [begin, end]",
                      quote_text(entry_.name));
      }
      offsets_[num_offsets_++] = v;
      return true;
    }
    return value("a number");
  }
  bool number_float(Json::number_float_t, const std::string& text) {
    if (state_ == State::kShape || state_ == State::kOffsets) {
      return reject("tensor {}: {} has the number {}; it must hold integers from 0 to 2^64 - 1",
                    quote_text(entry_.name), state_ == State::kShape ? "shape" : "data_offsets",
                    printable(text));
    }
    return value("a number");
  }
  bool string(std::string& v) {
    if (state_ == State::kMetadata) {
      metadata_.emplace(std::move(key_), std::move(v));
      return true;
    }
    if (state_ == State::kEntry && key_ == "dtype") {
      const std::optional<DType> dtype = dtype_from_name(v);
      if (!dtype) return reject("tensor {}: {}", quote_text(entry_.name), unknown_dtype_message(v));
      entry_.dtype = *dtype;
      return true;
    }
    return value("a string");
  }
  bool binary(Json::binary_t&) { return value("binary data"); }

  bool start_object(std::size_t) {
    switch (state_) {
      case State::kStart:
        state_ = State::kRoot;
        return true;
      case State::kRoot:
        if (key_ == "__metadata__") {
          state_ = State::kMetadata;
        } else {
          state_ = State::kEntry;
          entry_ = TensorInfo{};
          entry_.name = key_;
          fields_.clear();
          num_offsets_ = 0;
        }
        return true;
      default:
        return value("an object");
    }
  }
  bool end_object() {
    switch (state_) {
      case State::kRoot:
        state_ = State::kDone;
        return true;
      case State::kMetadata:
        state_ = State::kRoot;
        return true;
      case State::kEntry:
        state_ = State::kRoot;
        return finish_entry();
      default:
        return reject("unexpected end of an object");  // unreachable: the parser pairs them
    }
  }
  bool start_array(std::size_t) {
    if (state_ == State::kEntry && key_ == "shape") {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kEntry && key_ == "data_offsets") {
      state_ = State::kOffsets;
      return true;
    }
    return value("an array");
  }
  bool end_array() {
    if (state_ == State::kShape) {
      state_ = State::kEntry;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (num_offsets_ != 2) {
        return reject("tensor {}: data_offsets has {} numbers; it must be [begin, end]",
                      quote_text(entry_.name), num_offsets_);
      }
      state_ = State::kEntry;
      return true;
    }
    return reject("unexpected end of an array");  // unreachable: the parser pairs them
  }
  bool key(std::string& k) {
    switch (state_) {
      case State::kRoot:
        if (!top_keys_.insert(k).second) {
          if (k == "__metadata__") return reject("the header has __metadata__ twice");
          return reject("the header has the tensor {} twice; names must be unique", quote_text(k));
        }
        break;
      case State::kMetadata:
        if (metadata_.count(k) != 0) {
          return reject("__metadata__ has the key {} twice", quote_text(k));
        }
        break;
      case State::kEntry:
        if (k != "dtype" && k != "shape" && k != "data_offsets") {
          return reject(
              "tensor {}: unknown field {}; an entry has exactly dtype, shape and data_offsets",
              quote_text(entry_.name), quote_text(k));
        }
        if (!fields_.insert(k).second) {
          return reject("tensor {}: the entry has {} twice", quote_text(entry_.name), k);
        }
        break;
      default:
        return reject("unexpected key");  // unreachable: keys occur only in objects
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return reject("the header is not valid JSON: {}", printable(e.what(), 300));
  }

 private:
  enum class State {
    kStart,     // before the root value
    kRoot,      // in the root object: keys are tensor names or "__metadata__"
    kMetadata,  // in "__metadata__": string -> string
    kEntry,     // in one tensor's entry
    kShape,     // in its "shape" array
    kOffsets,   // in its "data_offsets" array
    kDone,      // after the root object
  };

  template <typename... Args>
  bool reject(fmt::format_string<Args...> format, Args&&... args) {
    error_ = fmt::format(format, std::forward<Args>(args)...);
    return false;
  }

  // A value of `kind` arrived where the state expects something else: say what was expected.
  bool value(std::string_view kind) {
    switch (state_) {
      case State::kStart:
        return reject("the header is {}; it must be a JSON object", kind);
      case State::kRoot:
        if (key_ == "__metadata__") {
          if (kind == "null") return true;  // the reference reads null as "no metadata"
          return reject("__metadata__ is {}; it must be an object mapping strings to strings",
                        kind);
        }
        return reject(
            "tensor {}: the entry is {}; it must be an object with dtype, shape and data_offsets",
            quote_text(key_), kind);
      case State::kMetadata:
        return reject("__metadata__ key {} has {} as its value; metadata values must be strings",
                      quote_text(key_), kind);
      case State::kEntry:
        if (key_ == "dtype") {
          return reject("tensor {}: dtype is {}; it must be a string such as \"F32\"",
                        quote_text(entry_.name), kind);
        }
        return reject("tensor {}: {} is {}; it must be an array of {}", quote_text(entry_.name),
                      key_, kind,
                      key_ == "shape" ? "non-negative integers" : "two integers, begin and end");
      case State::kShape:
        return reject("tensor {}: shape holds {}; dimensions must be non-negative integers",
                      quote_text(entry_.name), kind);
      case State::kOffsets:
        return reject("tensor {}: data_offsets holds {}; offsets must be non-negative integers",
                      quote_text(entry_.name), kind);
      case State::kDone:
        break;
    }
    return reject("unexpected {} after the header", kind);  // unreachable in strict parsing
  }

  static std::string unknown_dtype_message(std::string_view name) {
    if (std::find(kSubByteDTypes.begin(), kSubByteDTypes.end(), name) != kSubByteDTypes.end()) {
      return fmt::format("dtype {} packs several elements per byte; agora does not support it",
                         name);
    }
    return fmt::format("unknown dtype {}; allowed: {}", quote_text(name), allowed_dtypes());
  }

  // Checks one complete entry on its own; how the entries fit together is checked at the end.
  bool finish_entry() {
    const std::string name = quote_text(entry_.name);
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (fields_.count(field) == 0) {
        return reject("tensor {}: the entry has no {}; it needs dtype, shape and data_offsets",
                      name, field);
      }
    }
    entry_.begin = offsets_[0];
    entry_.end = offsets_[1];
    if (entry_.begin > entry_.end) {
      return reject("tensor {}: data_offsets [{}, {}] begin after they end", name, entry_.begin,
                    entry_.end);
    }
    const std::optional<uint64_t> bytes = byte_count(entry_.shape, entry_.dtype);
    if (!bytes) {
      return reject("tensor {}: shape [{}] of {} has more bytes than 2^64", name,
                    fmt::join(entry_.shape, ", "), dtype_name(entry_.dtype));
    }
    if (*bytes != entry_.end - entry_.begin) {
      return reject(
          "tensor {}: shape [{}] of {} needs {} bytes but data_offsets [{}, {}] span {} bytes",
          name, fmt::join(entry_.shape, ", "), dtype_name(entry_.dtype), *bytes, entry_.begin,
          entry_.end, entry_.end - entry_.begin);
    }
    if (entry_.end > data_size_) {
      return reject(
          "tensor {}: data_offsets [{}, {}] reach past the end of the data section, which has {} "
          "bytes",
          name, entry_.begin, entry_.end, data_size_);
    }
    tensors_.push_back(std::move(entry_));
    return true;
  }

  const uint64_t data_size_;
  State state_ = State::kStart;
  std::string key_;  // the last key read in the current object
  std::set<std::string> top_keys_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  TensorInfo entry_;              // the entry being read
  std::set<std::string> fields_;  // its fields seen so far
  std::array<uint64_t, 2> offsets_{};
  size_t num_offsets_ = 0;
  std::string error_;
};

[[noreturn]] void fail_short_file(std::string_view source_name, uint64_t size) {
  fail(
      "safetensors {}: the file has {} bytes, fewer than the 8-byte header length that starts a "
      "safetensors file",
      source_name, size);
}

}  // namespace

size_t dtype_size(DType dtype) {
  return entry_of(dtype).size;
}

std::string_view dtype_name(DType dtype) {
  return entry_of(dtype).name;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

DType parse_dtype(std::string_view name) {
  const std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype) fail("unknown dtype {}; allowed: {}", quote_text(name), allowed_dtypes());
  return *dtype;
}

uint64_t TensorInfo::num_elements() const {
  // Wraps for a shape that overflows; parse_safetensors() never hands out such a shape.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = 1;
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes,
                                    std::string_view source_name) {
  const uint64_t size = file_bytes.size();
  if (size < 8) fail_short_file(source_name, size);
  const uint64_t header_bytes = load_le64(file_bytes.data());
  if (header_bytes > kSafetensorsMaxHeaderBytes) {
    fail(
        "safetensors {}: the header length is {} bytes, above the limit of {} (corrupt, or not a "
        "safetensors file)",
        source_name, header_bytes, kSafetensorsMaxHeaderBytes);
  }
  if (header_bytes > size - 8) {
    fail(
        "safetensors {}: the header length is {} bytes but only {} bytes follow it (truncated "
        "file?)",
        source_name, header_bytes, size - 8);
  }
  const uint64_t data_offset = 8 + header_bytes;
  const uint64_t data_size = size - data_offset;

  HeaderHandler handler(data_size);
  const char* json = reinterpret_cast<const char*>(file_bytes.data() + 8);
  // nlohmann stops at a NUL byte as if the input ended there, which would let bytes after it
  // through unchecked. Valid JSON never holds a raw NUL (strings must escape control bytes).
  if (const void* nul = std::memchr(json, '\0', header_bytes); nul != nullptr) {
    fail("safetensors {}: the header is not valid JSON: it holds a NUL byte at offset {}",
         source_name, static_cast<const char*>(nul) - json);
  }
  if (!nlohmann::json::sax_parse(json, json + header_bytes, &handler)) {
    fail("safetensors {}: {}", source_name,
         handler.error().empty() ? std::string("the header is not valid JSON") : handler.error());
  }

  SafetensorsHeader header;
  header.tensors = std::move(handler.tensors());
  header.metadata = std::move(handler.metadata());
  header.data_offset = data_offset;

  // Sorted by offset, the tensors must tile the data section exactly, as the reference demands.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;  // the data section's bytes [0, covered) belong to tensors seen so far
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin < covered) {
      fail("safetensors {}: tensors {} at [{}, {}) and {} at [{}, {}) overlap", source_name,
           quote_text(previous->name), previous->begin, previous->end, quote_text(t.name), t.begin,
           t.end);
    }
    if (t.begin > covered) {
      fail(
          "safetensors {}: bytes [{}, {}) of the data section, before tensor {}, belong to no "
          "tensor; tensors must cover the data section without holes",
          source_name, covered, t.begin, quote_text(t.name));
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size) {
    fail(
        "safetensors {}: bytes [{}, {}) at the end of the data section belong to no tensor; "
        "tensors must cover the data section without holes",
        source_name, covered, data_size);
  }
  return header;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.file_ = MappedFile::open(path, "safetensors file");
  // An empty or short file maps fine and is rejected here, with the file's size.
  file.header_ = parse_safetensors(file.file_.bytes(), path.string());
  for (size_t i = 0; i < file.header_.tensors.size(); ++i) {
    file.index_.emplace(file.header_.tensors[i].name, i);
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  const TensorInfo* tensor = find(name);
  if (tensor == nullptr) {
    fail("safetensors {}: no tensor named {} (the file has {} tensors)", path().string(),
         quote_text(name), header_.tensors.size());
  }
  return *tensor;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& tensor) const {
  const std::span<const uint8_t> file_bytes = file_.bytes();
  // A file that opened has at least the 8-byte length, so only a moved-from one is empty.
  if (file_bytes.empty()) fail("bytes() of a moved-from SafetensorsFile");
  const uint64_t data_size = file_bytes.size() - header_.data_offset;
  if (tensor.begin > tensor.end || tensor.end > data_size) {
    fail("safetensors {}: tensor {} at [{}, {}) is outside the data section of {} bytes",
         path().string(), quote_text(tensor.name), tensor.begin, tensor.end, data_size);
  }
  return {file_bytes.data() + header_.data_offset + tensor.begin,
          static_cast<size_t>(tensor.end - tensor.begin)};
}

}  // namespace agora
