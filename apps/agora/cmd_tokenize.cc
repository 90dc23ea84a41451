// agora tokenize: text documents -> llm.c token shards (train and validation splits).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/data/corpus_tokenizer.h"
#include "commands.h"

namespace agora::cli {

void add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string tokenizer = "gpt2";
    std::vector<std::string> inputs;
    std::string out;
    double val_fraction = 0.01;
    uint64_t shard_tokens = 100'000'000;
    int threads = 0;
    bool force = false;
    bool lines = false;
    std::string field = "text";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text into llm.c token shards: a file is one document, a .jsonl file one per line");
  cmd->add_option("--tokenizer", args->tokenizer, "'gpt2' or the path of a SentencePiece .model")
      ->capture_default_str();
  cmd->add_option("--input", args->inputs,
                  "Files or folders of them: text, or JSON Lines (.jsonl, .ndjson); any of them "
                  "may be gzip- or Zstandard-compressed (.gz, .zst)")
      ->required();
  cmd->add_option("--out", args->out, "Output folder (train_*.bin, val_*.bin, meta.json)")
      ->required();
  cmd->add_option("--val-fraction", args->val_fraction,
                  "Fraction of documents for validation, chosen by content hash")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", args->shard_tokens, "Tokens per shard")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Worker threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace the output folder if it exists");
  cmd->add_flag("--lines", args->lines,
                "Each non-empty line is a document (an end-of-text before each), not each file");
  cmd->add_option("--field", args->field, "The key of each JSON Lines object that holds the text")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the summary as one JSON object instead of lines");
  cmd->callback([args] {
    const auto tokenizer = load_tokenizer(args->tokenizer);
    CorpusTokenizeOptions options;
    options.inputs.assign(args->inputs.begin(), args->inputs.end());
    options.out_dir = args->out;
    options.tokenizer_spec = args->tokenizer;
    options.val_fraction = args->val_fraction;
    options.shard_tokens = args->shard_tokens;
    options.threads = args->threads;
    options.force = args->force;
    options.line_documents = args->lines;
    options.field = args->field;
    options.progress = !args->json;
    const auto summary = tokenize_corpus(*tokenizer, options);
    if (args->json) {
      const SkippedLines& skipped = summary.skipped;
      const auto split = [](const SplitSummary& s) {
        return nlohmann::json{{"documents", s.documents},
                              {"tokens", s.tokens},
                              {"bytes", s.bytes},
                              {"shards", s.shards.size()}};
      };
      fmt::print("{}\n",
                 nlohmann::json{
                     {"event", "tokenized"},
                     {"out", args->out},
                     {"tokenizer", tokenizer->name()},
                     {"seconds", summary.seconds},
                     {"data_hash", summary.data_hash},
                     {"train", split(summary.train)},
                     {"val", split(summary.val)},
                     {"json_lines_documents", summary.json_lines_documents},
                     {"skipped_lines", skipped.total()},
                     {"skipped_examples", skipped.examples},
                 }
                     .dump());
      return;
    }
    const double mb = (summary.train.bytes + summary.val.bytes) / 1e6;
    fmt::print("tokenized {} documents ({:.1f} MB) with {} in {:.1f} s ({:.1f} MB/s)\n",
               summary.train.documents + summary.val.documents, mb, tokenizer->name(),
               summary.seconds, summary.seconds > 0 ? mb / summary.seconds : 0.0);
    fmt::print("  train: {} documents, {} tokens, {} shard(s)\n", summary.train.documents,
               summary.train.tokens, summary.train.shards.size());
    fmt::print("  val:   {} documents, {} tokens, {} shard(s)\n", summary.val.documents,
               summary.val.tokens, summary.val.shards.size());
    const SkippedLines& skipped = summary.skipped;
    if (skipped.total() > 0) {
      fmt::print(
          "  skipped {} lines that gave no document: {} not JSON, {} not an object, "
          "{} without \"{}\", {} where it is not a string, {} empty, {} blank, {} too long\n",
          skipped.total(), skipped.not_json, skipped.not_object, skipped.no_field, args->field,
          skipped.not_string, skipped.empty, skipped.blank, skipped.too_long);
      for (const auto& example : skipped.examples) fmt::print("    {}\n", example);
    }
    fmt::print("  wrote {}, data hash {} (data.hash in a run config)\n", args->out,
               summary.data_hash);
  });
}

}  // namespace agora::cli
