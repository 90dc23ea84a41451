// Trains a SentencePiece BPE vocabulary from text files, with the settings Llama-2's tokenizer
// uses, so small demo models get a vocabulary sized for them (a 50k vocabulary would dominate a
// tiny model's compute).
//
// Settings and why: BPE; vocab_size is an upper bound (a text with few distinct characters may
// give fewer pieces, e.g. digits and signs only); identity normalisation and no whitespace
// squeezing, so decoding gives back the exact text; byte fallback, so any text encodes without
// <unk>; digits split one by one; ids 0 <unk>, 1 <s>, 2 </s> (the end-of-text id), no padding
// piece. Training reads the inputs as agora tokenize does (data/document_reader.h: JSON Lines give
// their texts, compressed files are decompressed), line by line (a line is SentencePiece's
// "sentence"), keeps at most `max_sentences` of them (sampled by SentencePiece with a fixed seed)
// and is deterministic for the same inputs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace agora {

struct SentencePieceTrainOptions {
  std::vector<std::filesystem::path> inputs;  // text or JSON Lines files, maybe compressed
  std::string field = "text";                 // of JSON Lines objects
  uint32_t vocab_size = 8192;
  uint64_t max_sentences = 2'000'000;
  int threads = 0;  // 0: every core
};

struct SentencePieceTrainSummary {
  uint64_t lines = 0;
  uint64_t bytes = 0;
  uint32_t pieces = 0;  // the vocabulary's size: below vocab_size when the text ran out of merges
};

// Trains and writes the model to `model_file` atomically. Throws Error on bad options (naming the
// option, the value and the allowed range), unreadable inputs, or a failed training.
SentencePieceTrainSummary train_sentencepiece(const SentencePieceTrainOptions& options,
                                              const std::filesystem::path& model_file);

}  // namespace agora
