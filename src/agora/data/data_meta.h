// A token folder's meta.json: which tokenizer made the shards, and so the vocabulary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace agora {

struct DataMeta {
  std::string tokenizer_spec;  // "gpt2" or the path of a SentencePiece .model
  int64_t vocab_size = 0;
  int64_t eot_id = 0;
};

// Reads DIR/meta.json; throws Error naming the file when it is missing or malformed.
DataMeta read_data_meta(const std::filesystem::path& dir);

}  // namespace agora
