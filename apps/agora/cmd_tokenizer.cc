// agora tokenizer {train, encode, decode}: make a SentencePiece vocabulary, and look at what a
// tokenizer does to a text.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <iostream>
#include <iterator>
#include <sstream>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"
#include "agora/data/sentencepiece_trainer.h"
#include "agora/obs/progress.h"
#include "commands.h"

namespace agora::cli {
namespace {

std::string read_text(const std::string& text, const std::string& input) {
  if (!text.empty() && !input.empty()) fail("give either --text or --input, not both");
  if (!text.empty()) return text;
  if (input.empty() || input == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return read_file(input);
}

void add_train(CLI::App& parent) {
  auto options = std::make_shared<SentencePieceTrainOptions>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto* cmd = parent.add_subcommand("train", "Train a SentencePiece BPE vocabulary on text files");
  cmd->add_option("--input", *inputs,
                  "Files or folders of them: text, or JSON Lines (.jsonl, .ndjson); any of them "
                  "may be gzip- or Zstandard-compressed (.gz, .zst)")
      ->required();
  cmd->add_option("--field", options->field,
                  "The key of each JSON Lines object that holds the text")
      ->capture_default_str();
  cmd->add_option("--vocab-size", options->vocab_size, "Vocabulary size")->capture_default_str();
  cmd->add_option("--out", *out, "The .model file to write")->required();
  cmd->add_option("--max-sentences", options->max_sentences, "Lines sampled for training at most")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "Threads (0: every core)")->capture_default_str();
  cmd->callback([options, inputs, out] {
    options->inputs = list_documents({inputs->begin(), inputs->end()});
    fmt::print(stderr, "training a {}-piece BPE vocabulary on {} files...\n", options->vocab_size,
               options->inputs.size());
    const auto start = std::chrono::steady_clock::now();
    const auto summary = train_sentencepiece(*options, *out);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    fmt::print("trained a {}-piece vocabulary on {} lines ({}) in {} -> {}\n", summary.pieces,
               summary.lines, format_bytes(summary.bytes), format_duration(took.count()), *out);
  });
}

void add_encode(CLI::App& parent) {
  struct Args {
    std::string tokenizer = "gpt2", text, input;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand("encode", "Print the token ids of a text, space-separated");
  cmd->add_option("--tokenizer", args->tokenizer, "'gpt2' or a SentencePiece .model")
      ->capture_default_str();
  cmd->add_option("--text", args->text, "The text (default: --input, or standard input)");
  cmd->add_option("--input", args->input, "A file to read the text from ('-': standard input)");
  cmd->callback([args] {
    const auto tokenizer = load_tokenizer(args->tokenizer);
    fmt::print("{}\n", fmt::join(tokenizer->encode(read_text(args->text, args->input)), " "));
  });
}

void add_decode(CLI::App& parent) {
  struct Args {
    std::string tokenizer = "gpt2";
    std::vector<std::string> ids;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand("decode", "Print the text of token ids");
  cmd->add_option("--tokenizer", args->tokenizer, "'gpt2' or a SentencePiece .model")
      ->capture_default_str();
  cmd->add_option("ids", args->ids, "Token ids (default: read from standard input)");
  cmd->callback([args] {
    const auto tokenizer = load_tokenizer(args->tokenizer);
    std::vector<std::string> words = args->ids;
    if (words.empty()) {
      std::istringstream in(read_text("", "-"));
      words.assign(std::istream_iterator<std::string>(in), std::istream_iterator<std::string>());
    }
    std::vector<TokenId> ids;
    for (const auto& word : words) {
      size_t used = 0;
      unsigned long value = 0;
      try {
        value = std::stoul(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || value > UINT32_MAX) {
        fail("'{}' is not a token id (expected a non-negative integer)", word);
      }
      ids.push_back(static_cast<TokenId>(value));
    }
    fmt::print("{}", tokenizer->decode(ids));
  });
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenizer", "Train, or try out, a tokenizer");
  cmd->require_subcommand(1);
  add_train(*cmd);
  add_encode(*cmd);
  add_decode(*cmd);
}

}  // namespace agora::cli
