// SentencePieceTokenizer: any SentencePiece .model file (Llama-2's, or one `agora tokenizer
// train` made) behind agora's Tokenizer interface.
//
// The end-of-text id is the model's </s> (eos_id); a model without one is rejected at load,
// since documents could not be separated in token shards. Decoding is lossless for models trained
// by agora (identity normalisation, byte fallback) except for one character: U+2581 "▁" is
// SentencePiece's whitespace marker, so a literal U+2581 in the text decodes as a space.
// SentencePiece itself is reached through the bridge module (spm_bridge/spm_bridge.h says why).
#pragma once

#include <filesystem>
#include <memory>

#include "agora/data/tokenizer.h"

namespace agora {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws Error naming the file when it is missing, not a SentencePiece model, or has no </s>.
  static std::unique_ptr<SentencePieceTokenizer> load(const std::filesystem::path& model_file);
  ~SentencePieceTokenizer() override;

  using Tokenizer::encode;
  void encode(std::string_view text, std::vector<TokenId>& out) const override;
  std::string decode(std::span<const TokenId> ids) const override;
  uint32_t vocab_size() const override;
  TokenId eot_id() const override;
  std::string name() const override { return name_; }

 private:
  SentencePieceTokenizer(void* model, std::string name);

  void* model_;  // owned; released through the bridge
  std::string name_;
  uint32_t vocab_size_;
  TokenId eot_id_;
};

}  // namespace agora
