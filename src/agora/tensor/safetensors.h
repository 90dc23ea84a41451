// Safetensors files: the checkpoint format of Hugging Face, read through a memory map and written
// atomically, without torch.
//
// Layout:
//   u64 N, little-endian            the length of the header
//   N bytes of UTF-8 JSON           {"name": {"dtype": "F32", "shape": [2, 3],
//                                             "data_offsets": [begin, end]}, ...,
//                                    "__metadata__": {"key": "value", ...}}   (metadata optional)
//   data                            each tensor's bytes at [begin, end) of this section
// Tensor bytes are row-major and little-endian; the data section starts at 8 + N.
//
// Promises:
// - parse_safetensors() enforces the rules of the reference implementation (safetensors' Rust
//   crate) before anyone touches a byte of data: the header length is below 100 MB and inside the
//   file; the header is a JSON object without duplicate keys; every entry has exactly a known
//   dtype, a shape of non-negative integers and two offsets begin <= end; the shape's element
//   count times the dtype size equals end - begin, with no overflow; the tensors, sorted by
//   offset, cover the data section exactly (no overlap, no hole, nothing after the last one);
//   metadata values are strings. Anything else, hostile bytes included, is rejected with an
//   Error that names the source, the tensor and the problem; it never crashes, and the memory
//   it allocates is bounded by a small multiple of the header's length.
// - write_safetensors() writes what the reference writes and reads: the JSON header padded with
//   spaces so the data section starts at a multiple of 8 bytes, tensors laid out in the order
//   given. The same inputs give the same bytes. It streams each tensor straight from the
//   caller's memory into a temporary file beside the target, fsyncs it and renames it into
//   place, so a reader sees the old file or the new one, never a torn one.
// - Bytes are taken and handed out exactly as they are in memory. agora runs on little-endian
//   hosts (checked at compile time), where that is the format's byte order.
// - A SafetensorsFile is immutable and its const methods are thread-safe. Replace a checkpoint
//   with a rename (as write_safetensors does), never truncate it in place while a reader has it
//   mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agora/core/mapped_file.h"

namespace agora {

// The element types of the format, named as in the file. Sub-byte types (F4, F6_*) are not
// supported: a file that uses them is rejected with an Error that says so.
enum class DType {
  kBool,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kC64,  // complex64: two F32
  kI64,
  kU64,
};

// Bytes per element: 1 for BOOL, U8, I8 and the F8 types, 2, 4 or 8 for the rest.
size_t dtype_size(DType dtype);
// The name used in the file: "F32", "BF16", "BOOL", ...
std::string_view dtype_name(DType dtype);
// The dtype called `name` in a file, or nullopt for a name the format (or agora) does not know.
std::optional<DType> dtype_from_name(std::string_view name);
// Like dtype_from_name, but throws Error naming the dtype and the ones allowed.
DType parse_dtype(std::string_view name);

// The maximum header length the reader accepts, as in the reference implementation.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// The most dimensions a shape may have. The format sets none; numpy allows 64, torch fewer.
inline constexpr size_t kSafetensorsMaxRank = 64;

// One tensor of a file: where its bytes lie, relative to the start of the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // [] for a scalar
  uint64_t begin = 0;
  uint64_t end = 0;

  // The product of the shape (1 for a scalar, 0 when any dimension is 0).
  uint64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in file (offset) order; ties broken by end, then name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data section starts: 8 + the header length
};

// Parses and validates the header of a whole file, `file_bytes`, against its size. `source_name`
// (a path, a URL, "peer 3") only labels errors. Throws Error on any violation of the format.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes,
                                    std::string_view source_name);

// A validated, read-only memory map of one safetensors file. Move-only.
class SafetensorsFile {
 public:
  // Maps `path` and validates it with parse_safetensors(). Throws Error naming the path for a
  // missing or unreadable file, or any violation of the format.
  static SafetensorsFile open(const std::filesystem::path& path);

  ~SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return file_.path(); }
  // In file (offset) order.
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_offset() const { return header_.data_offset; }

  // The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // The tensor called `name`; throws Error naming the tensor and the file when it is absent.
  const TensorInfo& at(std::string_view name) const;
  // The bytes of `tensor` (one of tensors()), valid while this file is. No alignment is
  // promised: a file written by agora aligns the data section to 8 bytes, but a tensor's offset
  // within it is whatever the writer chose. Throws Error for a range outside the data section.
  std::span<const uint8_t> bytes(const TensorInfo& tensor) const;

 private:
  SafetensorsFile() = default;

  MappedFile file_;  // the whole file
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

// One tensor to write: the caller's bytes, which must outlive the call.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// The bytes write_safetensors() puts before the data: the u64 length and the JSON header,
// padded with spaces to a multiple of 8. Keys appear as "__metadata__" (when `metadata` is not
// empty) and then the tensors in the order given, which is also their order in the data section.
// Throws Error for a tensor whose bytes do not match its shape and dtype, a negative dimension,
// a duplicate or reserved name ("__metadata__"), text that is not valid UTF-8, or a header above
// kSafetensorsMaxHeaderBytes.
std::string safetensors_header_bytes(const std::vector<TensorView>& tensors,
                                     const std::map<std::string, std::string>& metadata);

// Writes `tensors` (in this order) and `metadata` to `path` atomically; see the promises above.
// Validates as safetensors_header_bytes() does before it creates any file. Throws Error naming
// the path when the file cannot be written.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace agora
