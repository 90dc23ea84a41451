#include "agora/data/sentencepiece_trainer.h"

#include <algorithm>
#include <string>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/document_reader.h"
#include "agora/data/spm_library.h"
#include "agora/data/tokenizer.h"
#include "agora/data/utf8.h"

namespace agora {
namespace {

// The non-empty lines of every input in order, read as data/document_reader.h reads them (so
// JSON Lines give the lines of their texts, and compressed files are decompressed), repaired to
// valid UTF-8 (tokenizer.h's rule). An input that cannot be read ends the stream and is reported
// after training returns: exceptions must not cross SentencePiece's frames.
class FileLines final : public spm::LineSource {
 public:
  FileLines(const std::vector<std::filesystem::path>& files, const std::string& field)
      : reader_(files, {.lines = true, .field = field}) {}

  bool next(std::string& line) override {
    try {
      while (true) {
        if (pos_ < document_.size()) {
          size_t end = document_.find('\n', pos_);
          if (end == std::string::npos) end = document_.size();
          line.assign(document_, pos_, end - pos_);
          pos_ = end + 1;
          if (line.empty()) continue;
          if (!is_valid_utf8(line)) line = repair_utf8(line);
          ++summary.lines;
          summary.bytes += line.size() + 1;
          return true;
        }
        if (!reader_.next(document_)) return false;
        pos_ = 0;
      }
    } catch (const std::exception& e) {
      unreadable = e.what();
      return false;
    }
  }

  SentencePieceTrainSummary summary;
  std::string unreadable;  // why an input could not be read

 private:
  DocumentReader reader_;
  std::string document_;
  size_t pos_ = 0;
};

}  // namespace

SentencePieceTrainSummary train_sentencepiece(const SentencePieceTrainOptions& options,
                                              const std::filesystem::path& model_file) {
  if (options.inputs.empty()) fail("tokenizer training: no --input files given");
  // 3 special pieces + 256 byte-fallback pieces must fit, with room for real merges.
  if (options.vocab_size < 300 || options.vocab_size > 1'000'000) {
    fail("tokenizer training: --vocab-size {} is out of range (allowed: 300 to 1000000)",
         options.vocab_size);
  }
  if (options.max_sentences == 0) fail("tokenizer training: --max-sentences must be at least 1");
  for (const auto& input : options.inputs) {
    if (!std::filesystem::is_regular_file(input)) {
      fail("tokenizer training: input {} is not a readable file", input.string());
    }
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const spm::TrainSpec spec = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      // A text with a small alphabet (digits split one by one, a few signs) may run out of
      // merges before the asked size: the vocabulary is then smaller (summary.pieces says).
      {"hard_vocab_limit", "false"},
      {"character_coverage", "0.99995"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"num_threads", std::to_string(threads)},
      // 2: errors only. SentencePiece writes its warnings to std::cerr, which is not usable
      // behind the bridge's deep-bound dlopen (a warning crashed training: "No valid symbol
      // found" when a small alphabet runs out of merges before the asked vocabulary size).
      {"minloglevel", "2"},
  };
  FileLines lines(options.inputs, options.field);
  std::string model, error;
  // Sentence sampling is the trainer's only randomness; a fixed seed makes it repeatable.
  const bool ok = spm::library().train(&spec, &lines, 20240520u, &model, &error);
  if (!lines.unreadable.empty()) fail("tokenizer training: {}", lines.unreadable);
  if (lines.summary.lines == 0) fail("tokenizer training: the inputs hold no text");
  if (!ok) fail("tokenizer training failed: {}", error);

  if (model_file.has_parent_path()) std::filesystem::create_directories(model_file.parent_path());
  write_file_atomic(model_file, model);
  SentencePieceTrainSummary summary = lines.summary;
  summary.pieces = load_tokenizer(model_file.string())->vocab_size();
  return summary;
}

}  // namespace agora
