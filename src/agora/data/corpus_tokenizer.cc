#include "agora/data/corpus_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hash.h"
#include "agora/data/shard.h"
#include "agora/obs/progress.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

// Writes one split's token stream as consecutive shards of exactly `shard_tokens` tokens.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, std::string prefix, int version, uint64_t shard_tokens,
              SplitSummary& summary)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        version_(version),
        shard_tokens_(shard_tokens),
        summary_(summary) {}

  void append(std::span<const TokenId> tokens) {
    while (!tokens.empty()) {
      if (!writer_) open_next();
      const uint64_t room = shard_tokens_ - in_shard_;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(room, tokens.size()));
      writer_->append(tokens.first(take));
      in_shard_ += take;
      summary_.tokens += take;
      tokens = tokens.subspan(take);
      if (in_shard_ == shard_tokens_) close_current();
    }
  }

  void finish() {
    if (writer_) close_current();
  }

 private:
  void open_next() {
    const std::string name = fmt::format("{}_{:06}.bin", prefix_, summary_.shards.size());
    writer_.emplace(dir_ / name, version_);
    summary_.shards.push_back(name);
    in_shard_ = 0;
  }
  void close_current() {
    writer_->finish();
    writer_.reset();
  }

  const fs::path dir_;
  const std::string prefix_;
  const int version_;
  const uint64_t shard_tokens_;
  SplitSummary& summary_;
  std::optional<ShardWriter> writer_;
  uint64_t in_shard_ = 0;
};

nlohmann::json split_json(const SplitSummary& split) {
  return {{"documents", split.documents},
          {"tokens", split.tokens},
          {"bytes", split.bytes},
          {"shards", split.shards}};
}

// One document's tokens, ready for the writer.
struct Tokenized {
  std::vector<TokenId> tokens;
  uint64_t bytes = 0;
  bool validation = false;
};

// Hands documents to worker threads in input order, as the reader gives them, and their tokens
// back in the same order, holding at most `window` documents the writer has not consumed yet
// (bounded memory: the slots are a ring of that size).
class OrderedWork {
 public:
  // `count`: the documents the first pass counted; the reader must give exactly these.
  OrderedWork(DocumentReader& reader, uint64_t count, size_t window)
      : reader_(reader), count_(count), slots_(window), window_(window) {}

  // The next document and its index, or nullopt when all are taken or the work stopped.
  std::optional<std::pair<size_t, std::string>> take() {
    std::lock_guard read(read_mutex_);  // one reader at a time keeps the order
    {
      std::unique_lock lock(mutex_);
      space_.wait(lock, [&] { return stopped_ || next_take_ < next_write_ + window_; });
      if (stopped_ || next_take_ == count_) return std::nullopt;
    }
    std::string text;
    if (!reader_.next(text)) {
      fail("the inputs changed while they were tokenized ({} documents, {} counted before)",
           next_take_, count_);
    }
    std::lock_guard lock(mutex_);
    return std::pair{next_take_++, std::move(text)};
  }
  void put(size_t index, Tokenized done) {
    std::lock_guard lock(mutex_);
    slots_[index % window_] = std::move(done);
    ready_.notify_all();
  }
  void put_error(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = error;
    stopped_ = true;
    ready_.notify_all();
    space_.notify_all();
  }
  // Blocks until document `index` (== the next in order) is done; rethrows a worker's error.
  Tokenized get(size_t index) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return error_ || slots_[index % window_].has_value(); });
    if (error_) std::rethrow_exception(error_);
    Tokenized done = std::move(*slots_[index % window_]);
    slots_[index % window_].reset();
    next_write_ = index + 1;
    space_.notify_all();
    return done;
  }
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    space_.notify_all();
  }

 private:
  DocumentReader& reader_;
  const uint64_t count_;
  std::mutex read_mutex_;
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::vector<std::optional<Tokenized>> slots_;
  const size_t window_;
  size_t next_take_ = 0;
  size_t next_write_ = 0;
  bool stopped_ = false;
  std::exception_ptr error_;
};

nlohmann::json skipped_json(const SkippedLines& skipped) {
  return {{"not_json", skipped.not_json}, {"not_object", skipped.not_object},
          {"no_field", skipped.no_field}, {"not_string", skipped.not_string},
          {"empty", skipped.empty},       {"blank", skipped.blank},
          {"too_long", skipped.too_long}};
}

}  // namespace

std::vector<fs::path> list_documents(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> documents;
  for (const auto& input : inputs) {
    if (fs::is_regular_file(input)) {
      documents.push_back(input);
    } else if (fs::is_directory(input)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::recursive_directory_iterator(input)) {
        if (entry.is_regular_file() && entry.path().filename().string().front() != '.') {
          found.push_back(entry.path());
        }
      }
      std::sort(found.begin(), found.end());
      documents.insert(documents.end(), found.begin(), found.end());
    } else {
      fail("input {} does not exist (expected a text file or a folder of them)", input.string());
    }
  }
  return documents;
}

std::string resolve_tokenizer_spec(const fs::path& data_dir, const std::string& spec) {
  return spec == "gpt2" ? spec : (data_dir / spec).string();
}

bool is_validation_document(std::string_view bytes, double val_fraction) {
  // 2^-64 resolution is plenty; compare in long double so a fraction of 1.0 takes everything.
  return static_cast<long double>(stable_hash64(bytes)) <
         static_cast<long double>(val_fraction) * 18446744073709551616.0L;
}

CorpusTokenizeSummary tokenize_corpus(const Tokenizer& tokenizer,
                                      const CorpusTokenizeOptions& options) {
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    fail("--val-fraction {} is out of range (allowed: 0 <= F < 1)", options.val_fraction);
  }
  if (options.shard_tokens < 1024) {
    fail("--shard-tokens {} is too small (allowed: at least 1024)", options.shard_tokens);
  }
  const fs::path out = options.out_dir;
  if (out.empty()) fail("--out is empty (expected a folder for the token shards)");
  if (fs::exists(out) && !options.force) {
    fail("output folder {} already exists; pass --force to replace it", out.string());
  }
  const std::vector<fs::path> files = list_documents(options.inputs);
  const DocumentReaderOptions reading{.lines = options.line_documents, .field = options.field};

  // Pass 1: count the documents and their bytes, and find the two that keep both splits
  // non-empty, so every split is known before any token is written; nothing is held.
  CorpusTokenizeSummary summary;
  uint64_t n = 0, total_bytes = 0, validation = 0;
  uint64_t min_hash = UINT64_MAX, max_hash = 0, min_index = 0, max_index = 0;
  {
    DocumentReader reader(files, reading);
    std::string text;
    while (reader.next(text)) {
      const uint64_t hash = stable_hash64(text);
      if (hash < min_hash) min_hash = hash, min_index = n;
      if (hash >= max_hash) max_hash = hash, max_index = n;
      validation += is_validation_document(text, options.val_fraction);
      total_bytes += text.size();
      ++n;
    }
    summary.skipped = reader.skipped();
    summary.json_lines_documents = reader.documents(DocumentFormat::kJsonLines);
  }
  if (n == 0) {
    fail("no documents found in the inputs{}",
         summary.skipped.total() > 0
             ? fmt::format(" ({} JSON Lines lines gave none; the first: {})",
                           summary.skipped.total(), summary.skipped.examples.front())
             : "");
  }
  // The document forced into validation (none drawn) or into training (all drawn), if any.
  std::optional<uint64_t> force_validation, force_train;
  if (options.val_fraction > 0 && n >= 2 && validation == 0) force_validation = min_index;
  if (n >= 2 && validation == n) force_train = max_index;
  const auto is_val = [&](uint64_t index, std::string_view text) {
    if (force_validation == index) return true;
    if (force_train == index) return false;
    return is_validation_document(text, options.val_fraction);
  };

  const fs::path tmp = out.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  const int version = shard_version_for_vocab(tokenizer.vocab_size());
  SplitWriter train(tmp, "train", version, options.shard_tokens, summary.train);
  SplitWriter val(tmp, "val", version, options.shard_tokens, summary.val);

  std::optional<Progress> progress;
  if (options.progress) progress.emplace("tokenize", total_bytes);
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Pass 2: the same documents again, tokenized on the workers, written in order.
  DocumentReader reader(files, reading);
  OrderedWork work(reader, n, 4 * static_cast<size_t>(threads) + 8);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      try {
        while (auto next = work.take()) {
          const auto& [index, text] = *next;
          Tokenized done{{tokenizer.eot_id()}, text.size(), is_val(index, text)};
          tokenizer.encode(text, done.tokens);
          if (progress) progress->add(text.size());
          work.put(index, std::move(done));
        }
      } catch (...) {
        work.put_error(std::current_exception());
      }
    });
  }
  try {
    for (uint64_t i = 0; i < n; ++i) {
      const Tokenized done = work.get(i);
      SplitSummary& split = done.validation ? summary.val : summary.train;
      ++split.documents;
      split.bytes += done.bytes;
      (done.validation ? val : train).append(done.tokens);
    }
    train.finish();
    val.finish();
    for (auto& worker : workers) worker.join();
    workers.clear();
    std::string extra;
    if (reader.next(extra)) {
      fail("the inputs changed while they were tokenized (more than the {} documents counted)", n);
    }
  } catch (...) {
    work.stop();
    for (auto& worker : workers) worker.join();
    fs::remove_all(tmp);
    throw;
  }
  if (progress) {
    progress->finish();
    summary.seconds = progress->elapsed_seconds();
  }
  // A SentencePiece model travels with its shards, so the folder is self-contained.
  std::string recorded_spec = options.tokenizer_spec;
  if (recorded_spec != "gpt2" && !recorded_spec.empty()) {
    fs::copy_file(recorded_spec, tmp / "tokenizer.model", fs::copy_options::overwrite_existing);
    recorded_spec = "tokenizer.model";
  }
  nlohmann::json meta = {
      {"format", "llm.c token shards (magic 20240520)"},
      {"tokenizer", tokenizer.name()},
      {"tokenizer_spec", recorded_spec},
      {"vocab_size", tokenizer.vocab_size()},
      {"eot_id", tokenizer.eot_id()},
      {"shard_version", version},
      {"val_fraction", options.val_fraction},
      {"shard_tokens", options.shard_tokens},
      {"train", split_json(summary.train)},
      {"val", split_json(summary.val)},
  };
  if (summary.json_lines_documents > 0 || summary.skipped.total() > 0) {
    meta["json_lines"] = {{"field", options.field},
                          {"documents", summary.json_lines_documents},
                          {"skipped_lines", skipped_json(summary.skipped)}};
  }
  write_file_atomic(tmp / "meta.json", meta.dump(2) + "\n");

  if (fs::exists(out)) fs::remove_all(out);
  fs::rename(tmp, out);
  return summary;
}

}  // namespace agora
