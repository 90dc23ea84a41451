// Fuzz target for text and ids from untrusted sources: utf8.h repair and Gpt2Tokenizer.
//
// Checks, for any bytes x:
// - repair_utf8(x) is valid, idempotent, and equals x exactly when x is valid;
// - encode(x) == encode(repair_utf8(x)), its ids are in range and never eot, and
//   decode(encode(x)) == repair_utf8(x);
// - decoding x reinterpreted as ids succeeds when every id is in range and otherwise throws
//   agora::Error, never anything worse.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "agora/core/error.h"
#include "agora/data/gpt2_tokenizer.h"
#include "agora/data/utf8.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

// Decodes `ids`, which must succeed exactly when all of them are below the vocabulary size.
void check_decode(const agora::Gpt2Tokenizer& gpt2, const std::vector<agora::TokenId>& ids) {
  bool in_range = true;
  size_t bytes = 0;
  for (const agora::TokenId id : ids) {
    in_range = in_range && id < gpt2.vocab_size();
    if (in_range) bytes += gpt2.token_bytes(id).size();
  }
  try {
    const std::string text = gpt2.decode(ids);
    check(in_range && text.size() == bytes);
  } catch (const agora::Error&) {
    check(!in_range);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto gpt2 = agora::Gpt2Tokenizer::load(agora::default_gpt2_dir());
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  const std::string repaired = agora::repair_utf8(input);
  check(agora::is_valid_utf8(repaired));
  check(agora::is_valid_utf8(input) == (repaired == input));
  check(agora::repair_utf8(repaired) == repaired);

  const std::vector<agora::TokenId> ids = gpt2->encode(input);
  check(gpt2->encode(repaired) == ids);
  for (const agora::TokenId id : ids) check(id < gpt2->vocab_size() && id != gpt2->eot_id());
  check(gpt2->decode(ids) == repaired);

  // The bytes as raw 32-bit ids (almost all out of range), and as 16-bit ids folded into a
  // range a little wider than the vocabulary (mostly valid, sometimes just past the end).
  std::vector<agora::TokenId> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  check_decode(*gpt2, raw);
  std::vector<agora::TokenId> folded;
  for (size_t i = 0; i + 1 < size; i += 2) {
    folded.push_back((data[i] | (data[i + 1] << 8)) % (gpt2->vocab_size() + 16));
  }
  check_decode(*gpt2, folded);
  return 0;
}
