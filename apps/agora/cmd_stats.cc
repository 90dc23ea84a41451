// agora stats: what a folder of token shards holds, split by split.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"
#include "agora/data/data_meta.h"
#include "agora/data/shard.h"
#include "agora/data/tokenizer.h"
#include "agora/obs/progress.h"
#include "commands.h"

namespace agora::cli {
namespace {
namespace fs = std::filesystem;

struct SplitStats {
  uint64_t shards = 0, tokens = 0, documents = 0, text_bytes = 0;
  std::unordered_map<TokenId, uint64_t> counts;
};

SplitStats scan_split(const fs::path& dir, const std::string& prefix, TokenId eot) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix + "_") && name.ends_with(".bin")) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  SplitStats stats;
  std::vector<TokenId> buffer(1 << 16);
  for (const auto& file : files) {
    const auto shard = ShardReader::open(file);
    ++stats.shards;
    stats.tokens += shard.num_tokens();
    for (size_t begin = 0; begin < shard.num_tokens(); begin += buffer.size()) {
      const size_t count = std::min(buffer.size(), shard.num_tokens() - begin);
      shard.copy(begin, count, buffer.data());
      for (size_t i = 0; i < count; ++i) {
        ++stats.counts[buffer[i]];
        stats.documents += buffer[i] == eot;
      }
    }
  }
  return stats;
}

std::string printable(std::string text) {
  std::string out;
  for (const char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return "'" + out + "'";
}

}  // namespace

void add_stats_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto top = std::make_shared<int>(10);
  auto tokenizer_spec = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("stats", "Show what a folder of token shards holds");
  cmd->add_option("dir", *dir, "A folder written by 'agora tokenize'")->required();
  cmd->add_option("--top", *top, "How many of the most frequent tokens to show")
      ->capture_default_str();
  cmd->add_option("--tokenizer", *tokenizer_spec,
                  "Tokenizer of the shards (default: the one meta.json names; needed for shards "
                  "made elsewhere, e.g. by llm.c)");
  cmd->callback([dir, top, tokenizer_spec] {
    const DataMeta meta = has_data_meta(*dir) ? read_data_meta(*dir) : DataMeta{};
    const std::string spec = tokenizer_spec->empty() ? meta.tokenizer_spec : *tokenizer_spec;
    if (spec.empty()) fail("{} has no meta.json naming its tokenizer; pass --tokenizer", *dir);
    const auto tokenizer = load_tokenizer(spec);
    const TokenId eot = tokenizer->eot_id();
    // meta.json keeps the name the tokenizer had when the shards were made (the copy inside the
    // folder is always called tokenizer.model).
    const std::string name = meta.tokenizer_name.empty() ? tokenizer->name() : meta.tokenizer_name;
    fmt::print("{}: tokenizer {} (vocabulary {}, end-of-text id {})\n", *dir, name,
               tokenizer->vocab_size(), eot);
    fmt::print("{:<6} {:>7} {:>10} {:>12} {:>12} {:>11} {:>12}\n", "split", "shards", "documents",
               "tokens", "text", "bytes/token", "tokens/doc");
    SplitStats train;
    for (const std::string split : {"train", "val"}) {
      SplitStats stats = scan_split(*dir, split, eot);
      const auto recorded = meta.text_bytes.find(split);
      const uint64_t bytes = recorded == meta.text_bytes.end() ? 0 : recorded->second;
      fmt::print("{:<6} {:>7} {:>10} {:>12} {:>12} {:>11.2f} {:>12.0f}\n", split, stats.shards,
                 stats.documents, stats.tokens, format_bytes(bytes),
                 stats.tokens ? double(bytes) / stats.tokens : 0.0,
                 stats.documents ? double(stats.tokens) / stats.documents : 0.0);
      if (split == "train") train = std::move(stats);
    }
    std::vector<std::pair<uint64_t, TokenId>> ranked;
    for (const auto& [id, count] : train.counts) ranked.emplace_back(count, id);
    std::sort(ranked.rbegin(), ranked.rend());
    fmt::print("distinct tokens in train: {} of {}\n", train.counts.size(),
               tokenizer->vocab_size());
    fmt::print("most frequent in train:\n");
    for (int i = 0; i < *top && i < static_cast<int>(ranked.size()); ++i) {
      const auto [count, id] = ranked[i];
      const TokenId one[] = {id};
      fmt::print("  {:>6}  {:>6.2f}%  {}\n", id, 100.0 * count / train.tokens,
                 printable(tokenizer->decode(one)));
    }
  });
}

}  // namespace agora::cli
