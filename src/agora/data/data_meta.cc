#include "agora/data/data_meta.h"

#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"

namespace agora {
namespace fs = std::filesystem;

bool has_data_meta(const fs::path& dir) {
  return fs::exists(dir / "meta.json");
}

DataMeta read_data_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  if (!fs::exists(path)) {
    fail("data.dir {} has no meta.json; make it with 'agora tokenize' (it records the tokenizer)",
         dir.string());
  }
  try {
    const auto j = nlohmann::json::parse(read_file(path));
    DataMeta meta;
    meta.tokenizer_spec = resolve_tokenizer_spec(dir, j.at("tokenizer_spec").get<std::string>());
    meta.vocab_size = j.at("vocab_size").get<int64_t>();
    meta.eot_id = j.at("eot_id").get<int64_t>();
    meta.tokenizer_name = j.value("tokenizer", std::string());
    for (const char* split : {"train", "val"}) {
      if (j.contains(split)) meta.text_bytes[split] = j.at(split).value("bytes", uint64_t{0});
    }
    return meta;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed: {}", path.string(), e.what());
  }
}

}  // namespace agora
