#include "agora/data/sentencepiece_tokenizer.h"

#include "agora/core/error.h"
#include "agora/data/spm_library.h"
#include "agora/data/utf8.h"

namespace agora {

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(
    const std::filesystem::path& model_file) {
  if (!std::filesystem::is_regular_file(model_file)) {
    fail("tokenizer {}: no such file (expected 'gpt2' or a SentencePiece .model file)",
         model_file.string());
  }
  const auto& spm = spm::library();
  std::string error;
  void* model = spm.load(model_file.c_str(), &error);
  if (!model) fail("tokenizer {}: not a SentencePiece model: {}", model_file.string(), error);
  // Owned from here on, so an early failure below releases it.
  std::unique_ptr<SentencePieceTokenizer> tokenizer(
      new SentencePieceTokenizer(model, model_file.filename().string()));
  if (spm.eos_id(model) < 0) {
    fail(
        "tokenizer {}: the model has no end-of-sentence piece (</s>), which agora needs to "
        "separate documents; train it with eos_id >= 0",
        model_file.string());
  }
  return tokenizer;
}

SentencePieceTokenizer::SentencePieceTokenizer(void* model, std::string name)
    : model_(model),
      name_(std::move(name)),
      vocab_size_(static_cast<uint32_t>(spm::library().piece_size(model))),
      eot_id_(static_cast<TokenId>(spm::library().eos_id(model))) {}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  spm::library().release(model_);
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<TokenId>& out) const {
  // SentencePiece would map invalid bytes its own way; repairing first gives every tokenizer
  // the same documented behaviour (tokenizer.h).
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<int> ids;
  std::string error;
  if (!spm::library().encode(model_, text, &ids, &error)) {
    fail("tokenizer {}: encode failed: {}", name_, error);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(std::span<const TokenId> ids) const {
  std::vector<int> as_int;
  as_int.reserve(ids.size());
  for (const TokenId id : ids) {
    if (id >= vocab_size_) {
      fail("tokenizer {}: token id {} is out of range (vocabulary size {})", name_, id,
           vocab_size_);
    }
    as_int.push_back(static_cast<int>(id));
  }
  std::string text, error;
  if (!spm::library().decode(model_, &as_int, &text, &error)) {
    fail("tokenizer {}: decode failed: {}", name_, error);
  }
  return text;
}

uint32_t SentencePieceTokenizer::vocab_size() const {
  return vocab_size_;
}

TokenId SentencePieceTokenizer::eot_id() const {
  return eot_id_;
}

}  // namespace agora
