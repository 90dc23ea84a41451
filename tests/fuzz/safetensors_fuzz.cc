// Fuzzes parse_safetensors: any bytes must be rejected with an Error or accepted with a header
// whose promises hold.
//
// For an accepted input it checks what a caller relies on: tensors in offset order, each inside
// the data section, its size equal to its element count times its dtype size, and together
// covering the data section exactly. It reads every tensor's bytes, so a range outside the input
// trips AddressSanitizer. Then it writes the header again with safetensors_header_bytes() and
// parses header + the same data: the writer must accept whatever the reader accepted, and the
// reader must get back the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/tensor/safetensors.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool same(const agora::TensorInfo& a, const agora::TensorInfo& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
         a.end == b.end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  agora::SafetensorsHeader header;
  try {
    header = agora::parse_safetensors(input, "fuzz input");
  } catch (const agora::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }

  check(header.data_offset >= 8 && header.data_offset <= size);
  const uint64_t data_size = size - header.data_offset;
  const uint8_t* section = data + header.data_offset;
  uint64_t covered = 0;
  uint64_t sum = 0;
  for (const agora::TensorInfo& t : header.tensors) {
    check(t.begin == covered);  // sorted, no overlap, no hole
    check(t.begin <= t.end && t.end <= data_size);
    check(t.num_elements() * agora::dtype_size(t.dtype) == t.num_bytes());
    check(t.shape.size() <= agora::kSafetensorsMaxRank);
    for (const int64_t d : t.shape) check(d >= 0);
    for (uint64_t i = t.begin; i < t.end; ++i) sum += section[i];
    covered = t.end;
  }
  check(covered == data_size);

  std::vector<agora::TensorView> views;
  for (const agora::TensorInfo& t : header.tensors) {
    views.push_back(
        {t.name, t.dtype, t.shape, input.subspan(header.data_offset + t.begin, t.num_bytes())});
  }
  std::string again;
  try {
    again = agora::safetensors_header_bytes(views, header.metadata);
  } catch (const agora::Error&) {
    std::abort();  // the writer refused what the reader accepted
  }
  check(again.size() % 8 == 0);
  again.append(reinterpret_cast<const char*>(section), data_size);
  const agora::SafetensorsHeader reread = agora::parse_safetensors(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(again.data()), again.size()),
      "rewritten fuzz input");
  check(reread.metadata == header.metadata);
  check(reread.tensors.size() == header.tensors.size());
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    check(same(reread.tensors[i], header.tensors[i]));
  }
  // Keeps the byte reads from being optimized away.
  check(sum != UINT64_MAX);
  return 0;
}
