// Fuzz target for SentencePieceTokenizer (through the bridge module) on untrusted bytes.
//
// A small BPE model is trained once at start-up on generated text, so the target needs no data
// files. Checks, for any bytes x:
// - encode(x) == encode(repair_utf8(x)) and every id is in range;
// - decode(encode(x)) == repair_utf8(x) with U+2581 read as a space (lossless otherwise: identity
//   normalisation, byte fallback; U+2581 is SentencePiece's own whitespace marker);
// - decoding x read as 16-bit ids succeeds exactly when every id is in range, and otherwise
//   throws agora::Error, never anything worse.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/data/sentencepiece_tokenizer.h"
#include "agora/data/sentencepiece_trainer.h"
#include "agora/data/utf8.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

std::unique_ptr<agora::SentencePieceTokenizer> make_tokenizer() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("agora_spm_fuzz_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 200; ++i) {
      text << "It's " << i << " o'clock: the quick brown fox jumps over the lazy dog.\n"
           << "Ünïcödé, 東京, Москва, مرحبا, 🎉🎉 and\ttabs   and spaces.\n";
    }
  }
  agora::SentencePieceTrainOptions options;
  options.inputs = {dir / "text.txt"};
  options.vocab_size = 350;
  options.threads = 1;
  agora::train_sentencepiece(options, dir / "fuzz.model");
  auto tokenizer = agora::SentencePieceTokenizer::load(dir / "fuzz.model");
  fs::remove_all(dir);
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto spm = make_tokenizer();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string repaired = agora::repair_utf8(input);

  const std::vector<agora::TokenId> ids = spm->encode(input);
  check(spm->encode(repaired) == ids);
  for (const agora::TokenId id : ids) check(id < spm->vocab_size());
  std::string expected = repaired;
  for (size_t at; (at = expected.find("\xE2\x96\x81")) != std::string::npos;) {
    expected.replace(at, 3, " ");
  }
  check(spm->decode(ids) == expected);

  std::vector<agora::TokenId> raw;
  bool in_range = true;
  for (size_t i = 0; i + 1 < size; i += 2) {
    raw.push_back(data[i] | (data[i + 1] << 8));
    in_range = in_range && raw.back() < spm->vocab_size();
  }
  try {
    spm->decode(raw);
    check(in_range);
  } catch (const agora::Error&) {
    check(!in_range);
  }
  return 0;
}
