// A token folder's meta.json: which tokenizer made the shards, and so the vocabulary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace agora {

struct DataMeta {
  std::string tokenizer_spec;  // "gpt2" or the path of a SentencePiece .model
  int64_t vocab_size = 0;
  int64_t eot_id = 0;
  std::string tokenizer_name;                  // as named when the shards were made, if recorded
  std::map<std::string, uint64_t> text_bytes;  // per split ("train", "val"), if recorded
};

// Reads DIR/meta.json; throws Error naming the file when it is missing or malformed.
DataMeta read_data_meta(const std::filesystem::path& dir);
// Whether DIR has a meta.json (shards made elsewhere, e.g. by llm.c, have none).
bool has_data_meta(const std::filesystem::path& dir);

}  // namespace agora
