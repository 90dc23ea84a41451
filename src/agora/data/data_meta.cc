#include "agora/data/data_meta.h"

#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"

namespace agora {
namespace fs = std::filesystem;

DataMeta read_data_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  if (!fs::exists(path)) {
    fail("data.dir {} has no meta.json; make it with 'agora tokenize' (it records the tokenizer)",
         dir.string());
  }
  try {
    const auto j = nlohmann::json::parse(read_file(path));
    return {resolve_tokenizer_spec(dir, j.at("tokenizer_spec").get<std::string>()),
            j.at("vocab_size").get<int64_t>(), j.at("eot_id").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed: {}", path.string(), e.what());
  }
}

}  // namespace agora
