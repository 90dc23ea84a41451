#include "agora/data/corpus_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hash.h"
#include "agora/data/data_identity.h"
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
  uint64_t hash = 0;  // stable_hash64 of the text
};

// Hands documents to worker threads in input order, as the reader gives them, and their tokens
// back in the same order, holding at most `window` documents the writer has not consumed yet
// (bounded memory: the slots are a ring of that size).
class OrderedWork {
 public:
  OrderedWork(DocumentReader& reader, size_t window, Progress* progress)
      : reader_(reader), progress_(progress), slots_(window), window_(window) {}

  // The next document and its index, or nullopt when all are taken or the work stopped.
  std::optional<std::pair<uint64_t, std::string>> take() {
    std::lock_guard read(read_mutex_);  // one reader at a time keeps the order
    {
      std::unique_lock lock(mutex_);
      space_.wait(lock, [&] { return stopped_ || next_take_ < next_write_ + window_; });
      if (stopped_ || read_all_) return std::nullopt;
    }
    std::string text;
    const uint64_t before = reader_.input_bytes();
    const bool more = reader_.next(text);
    if (progress_) progress_->add(reader_.input_bytes() - before);
    std::lock_guard lock(mutex_);
    if (!more) {
      read_all_ = true;
      ready_.notify_all();
      return std::nullopt;
    }
    return std::pair{next_take_++, std::move(text)};
  }
  void put(uint64_t index, Tokenized done) {
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
  // The next document in order, once done; nullopt after the last. Rethrows a worker's error.
  std::optional<Tokenized> next() {
    std::unique_lock lock(mutex_);
    const uint64_t index = next_write_;
    auto& slot = slots_[index % window_];
    ready_.wait(lock, [&] {
      return error_ || (index < next_take_ && slot.has_value()) ||
             (read_all_ && index == next_take_);
    });
    if (error_) std::rethrow_exception(error_);
    if (!(index < next_take_ && slot.has_value())) return std::nullopt;
    Tokenized done = std::move(*slot);
    slot.reset();
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
  Progress* const progress_;
  std::mutex read_mutex_;
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::vector<std::optional<Tokenized>> slots_;
  const size_t window_;
  uint64_t next_take_ = 0;
  uint64_t next_write_ = 0;
  bool read_all_ = false;
  bool stopped_ = false;
  std::exception_ptr error_;
};

// What one pass over the inputs saw, beyond the shards it wrote.
struct Pass {
  uint64_t documents = 0;
  uint64_t validation = 0;
  uint64_t min_hash_index = 0;  // the document drawn into validation if none was
  uint64_t max_hash_index = 0;  // the document kept for training if all were drawn
};

// The document forced into one split so that both have one, by its index in input order.
struct Forced {
  std::optional<uint64_t> validation, train;
};

// Reads every document once, tokenizes them on `threads` workers and writes them, in input
// order, to `dir`'s two splits.
Pass tokenize_pass(const Tokenizer& tokenizer, const std::vector<fs::path>& files,
                   const DocumentReaderOptions& reading, const CorpusTokenizeOptions& options,
                   const fs::path& dir, const Forced& forced, int threads,
                   CorpusTokenizeSummary& summary, Progress* progress) {
  summary.train = {};
  summary.val = {};
  const int version = shard_version_for_vocab(tokenizer.vocab_size());
  SplitWriter train(dir, "train", version, options.shard_tokens, summary.train);
  SplitWriter val(dir, "val", version, options.shard_tokens, summary.val);
  DocumentReader reader(files, reading);
  OrderedWork work(reader, 4 * static_cast<size_t>(threads) + 8, progress);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      try {
        while (auto next = work.take()) {
          const auto& [index, text] = *next;
          Tokenized done{{tokenizer.eot_id()}, text.size(), stable_hash64(text)};
          tokenizer.encode(text, done.tokens);
          work.put(index, std::move(done));
        }
      } catch (...) {
        work.put_error(std::current_exception());
      }
    });
  }
  Pass pass;
  uint64_t min_hash = UINT64_MAX, max_hash = 0;
  try {
    for (uint64_t index = 0;; ++index) {
      const std::optional<Tokenized> done = work.next();
      if (!done) break;
      if (done->hash < min_hash) min_hash = done->hash, pass.min_hash_index = index;
      if (done->hash >= max_hash) max_hash = done->hash, pass.max_hash_index = index;
      const bool drawn = is_validation_hash(done->hash, options.val_fraction);
      pass.validation += drawn;
      const bool validation = forced.validation == index || (drawn && forced.train != index);
      SplitSummary& split = validation ? summary.val : summary.train;
      ++split.documents;
      split.bytes += done->bytes;
      (validation ? val : train).append(done->tokens);
      ++pass.documents;
    }
    train.finish();
    val.finish();
  } catch (...) {
    work.stop();
    for (auto& worker : workers) worker.join();
    throw;
  }
  for (auto& worker : workers) worker.join();
  summary.skipped = reader.skipped();
  summary.json_lines_documents = reader.documents(DocumentFormat::kJsonLines);
  return pass;
}

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

bool is_validation_hash(uint64_t hash, double val_fraction) {
  // 2^-64 resolution is plenty; compare in long double so a fraction of 1.0 takes everything.
  return static_cast<long double>(hash) <
         static_cast<long double>(val_fraction) * 18446744073709551616.0L;
}

bool is_validation_document(std::string_view bytes, double val_fraction) {
  return is_validation_hash(stable_hash64(bytes), val_fraction);
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
  uint64_t input_bytes = 0;
  for (const auto& file : files) input_bytes += fs::file_size(file);

  const fs::path tmp = out.string() + ".tmp";
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto start = std::chrono::steady_clock::now();
  CorpusTokenizeSummary summary;
  // One pass reads, splits and writes everything. Both splits must get a document when there
  // are two or more; if the hashes drew none (or all) into validation, which only a tiny corpus
  // or fraction does, a second pass writes the same documents with one of them moved.
  Forced forced;
  for (int attempt = 0;; ++attempt) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::optional<Progress> progress;
    if (options.progress) progress.emplace("tokenize", input_bytes);
    Pass pass;
    try {
      pass = tokenize_pass(tokenizer, files, reading, options, tmp, forced, threads, summary,
                           progress ? &*progress : nullptr);
    } catch (...) {
      fs::remove_all(tmp);
      throw;
    }
    if (progress) progress->finish();
    if (pass.documents == 0) {
      fs::remove_all(tmp);
      fail("no documents found in the inputs{}",
           summary.skipped.total() > 0
               ? fmt::format(" ({} lines gave none; the first: {})", summary.skipped.total(),
                             summary.skipped.examples.front())
               : "");
    }
    if (attempt > 0 || pass.documents < 2) break;
    if (options.val_fraction > 0 && pass.validation == 0) {
      forced.validation = pass.min_hash_index;
    } else if (pass.validation == pass.documents) {
      forced.train = pass.max_hash_index;
    } else {
      break;
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

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
      {"shard_version", shard_version_for_vocab(tokenizer.vocab_size())},
      {"val_fraction", options.val_fraction},
      {"shard_tokens", options.shard_tokens},
      {"train", split_json(summary.train)},
      {"val", split_json(summary.val)},
  };
  summary.data_hash = data_identity(tmp).hex();
  meta["data_hash"] = summary.data_hash;
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
