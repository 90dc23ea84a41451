#include "agora/data/tokenizer.h"

#include "agora/data/gpt2_tokenizer.h"
#include "agora/data/sentencepiece_tokenizer.h"

namespace agora {

std::unique_ptr<Tokenizer> load_tokenizer(std::string_view spec) {
  if (spec == "gpt2") return Gpt2Tokenizer::load(default_gpt2_dir());
  return SentencePieceTokenizer::load(std::filesystem::path(spec));
}

}  // namespace agora
