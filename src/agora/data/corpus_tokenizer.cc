#include "agora/data/corpus_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

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

// The documents to tokenize: whole files, read when needed, or the lines of the files, held in
// memory (a corpus of lines is a corpus of short items).
class Documents {
 public:
  Documents(std::vector<fs::path> files, bool lines) : files_(std::move(files)), lines_mode_(lines) {
    if (!lines_mode_) return;
    for (const auto& file : files_) {
      const std::string text = read_file(file);
      size_t begin = 0;
      while (begin < text.size()) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        if (end > begin) lines_.push_back(text.substr(begin, end - begin));
        begin = end + 1;
      }
    }
  }

  size_t size() const { return lines_mode_ ? lines_.size() : files_.size(); }
  std::string text(size_t i) const { return lines_mode_ ? lines_[i] : read_file(files_[i]); }
  uint64_t bytes(size_t i) const {
    return lines_mode_ ? lines_[i].size() : fs::file_size(files_[i]);
  }

 private:
  std::vector<fs::path> files_;
  bool lines_mode_;
  std::vector<std::string> lines_;
};

nlohmann::json split_json(const SplitSummary& split) {
  return {{"documents", split.documents},
          {"tokens", split.tokens},
          {"bytes", split.bytes},
          {"shards", split.shards}};
}

// Hands documents to worker threads and their tokens back in input order, holding at most
// `window` finished documents that the writer has not consumed yet (bounded memory).
class OrderedWork {
 public:
  OrderedWork(size_t count, size_t window) : slots_(count), window_(window) {}

  // The next document index for a worker, or nullopt when all are taken or the work stopped.
  std::optional<size_t> take() {
    std::unique_lock lock(mutex_);
    space_.wait(lock, [&] { return stopped_ || next_take_ < next_write_ + window_; });
    if (stopped_ || next_take_ == slots_.size()) return std::nullopt;
    return next_take_++;
  }
  void put(size_t index, std::vector<TokenId> tokens) {
    std::lock_guard lock(mutex_);
    slots_[index] = std::move(tokens);
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
  std::vector<TokenId> get(size_t index) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return error_ || slots_[index].has_value(); });
    if (error_) std::rethrow_exception(error_);
    std::vector<TokenId> tokens = std::move(*slots_[index]);
    slots_[index].reset();
    next_write_ = index + 1;
    space_.notify_all();
    return tokens;
  }
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    space_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::vector<std::optional<std::vector<TokenId>>> slots_;
  const size_t window_;
  size_t next_take_ = 0;
  size_t next_write_ = 0;
  bool stopped_ = false;
  std::exception_ptr error_;
};

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
  const Documents documents(list_documents(options.inputs), options.line_documents);
  if (documents.size() == 0) fail("no documents found in the inputs");

  // Pass 1: split assignment by content hash, so it is known before any token is written.
  const size_t n = documents.size();
  std::vector<uint64_t> hashes(n);
  std::vector<bool> is_val(n);
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string bytes = documents.text(i);
    hashes[i] = stable_hash64(bytes);
    is_val[i] = is_validation_document(bytes, options.val_fraction);
    total_bytes += bytes.size();
  }
  const auto count_val = std::count(is_val.begin(), is_val.end(), true);
  if (options.val_fraction > 0 && n >= 2 && count_val == 0) {
    is_val[std::min_element(hashes.begin(), hashes.end()) - hashes.begin()] = true;
  }
  if (n >= 2 && count_val == static_cast<long>(n)) {
    is_val[std::max_element(hashes.begin(), hashes.end()) - hashes.begin()] = false;
  }

  const fs::path tmp = out.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  CorpusTokenizeSummary summary;
  const int version = shard_version_for_vocab(tokenizer.vocab_size());
  SplitWriter train(tmp, "train", version, options.shard_tokens, summary.train);
  SplitWriter val(tmp, "val", version, options.shard_tokens, summary.val);

  std::optional<Progress> progress;
  if (options.progress) progress.emplace("tokenize", total_bytes);
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  OrderedWork work(n, 4 * static_cast<size_t>(threads) + 8);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      try {
        while (const auto index = work.take()) {
          const std::string text = documents.text(*index);
          std::vector<TokenId> tokens{tokenizer.eot_id()};
          tokenizer.encode(text, tokens);
          if (progress) progress->add(text.size());
          work.put(*index, std::move(tokens));
        }
      } catch (...) {
        work.put_error(std::current_exception());
      }
    });
  }
  try {
    for (size_t i = 0; i < n; ++i) {
      const std::vector<TokenId> tokens = work.get(i);
      SplitSummary& split = is_val[i] ? summary.val : summary.train;
      ++split.documents;
      split.bytes += documents.bytes(i);
      (is_val[i] ? val : train).append(tokens);
    }
    train.finish();
    val.finish();
  } catch (...) {
    work.stop();
    for (auto& worker : workers) worker.join();
    fs::remove_all(tmp);
    throw;
  }
  for (auto& worker : workers) worker.join();
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
  const nlohmann::json meta = {
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
  write_file_atomic(tmp / "meta.json", meta.dump(2) + "\n");

  if (fs::exists(out)) fs::remove_all(out);
  fs::rename(tmp, out);
  return summary;
}

}  // namespace agora
