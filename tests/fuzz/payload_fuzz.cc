// Fuzzes decode_payload: any bytes must be rejected with an Error or accepted as a payload whose
// promises hold.
//
// The encoding is canonical, so an accepted input must be exactly what encode_payload() writes
// for the decoded payload: re-encoding gives the input back byte for byte, encoded_size() of its
// layout is the input's size, and decoding again (with the layout as the expected one) gives the
// same payload. The writer must accept whatever the reader accepted. For the position codes of
// version 2 this is the canonical property itself: a rank, Elias-Fano bitmap or padding bit the
// writer would not produce for the decoded positions fails the byte comparison.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agora/core/error.h"
#include "agora/optim/payload.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Payload's == takes -0 for +0; the canonical form does not.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  agora::Payload payload;
  try {
    payload = agora::decode_payload(input);
  } catch (const agora::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }

  agora::PayloadLayout layout{payload.kind, {}};
  for (const agora::TensorPayload& t : payload.tensors) layout.tensors.push_back(t.layout);
  std::string again;
  try {
    check(agora::encoded_size(layout) == size);
    again = agora::encode_payload(payload);
  } catch (const agora::Error&) {
    std::abort();  // the writer refused what the reader accepted
  }
  check(again == input);

  const agora::Payload reread = agora::decode_payload(again, layout);
  check(reread == payload);
  for (size_t i = 0; i < payload.tensors.size(); ++i) {
    check(same_bits(reread.tensors[i].values, payload.tensors[i].values));
    check(same_bits(reread.tensors[i].scales, payload.tensors[i].scales));
  }
  return 0;
}
