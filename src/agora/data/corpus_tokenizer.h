// Turns a set of text documents into llm.c token shards, split into train and validation.
//
// Promises:
// - The inputs are files or folders (a folder stands for every file below it, hidden files
//   skipped, in sorted path order), read as data/document_reader.h says: a .jsonl (.ndjson)
//   file gives the string under `field` of each line's object, `line_documents` makes each
//   non-empty line of the other files one document, and otherwise a file is one document; gzip
//   and Zstandard files are decompressed. JSON Lines lines that give no document are counted by
//   reason in the summary and in meta.json, never dropped unseen. Each document is written as
//   <end-of-text> followed by its tokens (llm.c's convention), in input order, so the output is
//   the same on every run, and a JSON Lines file gives the same shards as the same texts as
//   plain files.
// - Memory does not grow with the corpus: the inputs are read once, holding a bounded window of
//   documents in flight (a second pass only when a tiny corpus needs a document moved so that
//   both splits get one).
// - A document goes to the validation split when the BLAKE2b hash of its bytes, read as a
//   fraction of 2^64, is below `val_fraction`: the split depends on content alone, not on paths,
//   order or machine, and duplicate documents land in the same split. With a fraction > 0 and at
//   least two documents, both splits get at least one document.
// - Shards hold exactly `shard_tokens` tokens except the last of each split (documents may span
//   two shards, as in llm.c): DIR/train_000000.bin ..., DIR/val_000000.bin ..., plus
//   DIR/meta.json describing the tokenizer, the counts and the folder's data hash
//   (data/data_identity.h). A SentencePiece model is copied in as
//   DIR/tokenizer.model and meta.json's tokenizer_spec names it relative to DIR ("gpt2" stays
//   "gpt2"), so the folder is self-contained.
// - The folder appears whole or not at all: everything is written to DIR.tmp and renamed. An
//   existing DIR is an error unless `force` is set, in which case it is replaced.
// - Documents are tokenized on `threads` threads; a progress line shows the input files' MB/s
//   (compressed bytes for compressed files) and ETA.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agora/data/document_reader.h"
#include "agora/data/tokenizer.h"

namespace agora {

struct CorpusTokenizeOptions {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out_dir;
  std::string tokenizer_spec;  // recorded in meta.json
  double val_fraction = 0.01;
  uint64_t shard_tokens = 100'000'000;
  bool force = false;
  bool line_documents = false;
  std::string field = "text";  // of JSON Lines objects
  int threads = 0;  // 0: every core
  bool progress = true;
};

struct SplitSummary {
  uint64_t documents = 0;
  uint64_t tokens = 0;  // including one end-of-text per document
  uint64_t bytes = 0;   // of text
  std::vector<std::string> shards;
};

struct CorpusTokenizeSummary {
  SplitSummary train;
  SplitSummary val;
  SkippedLines skipped;
  uint64_t json_lines_documents = 0;
  std::string data_hash;  // the folder's identity (data/data_identity.h), hex
  double seconds = 0;
};

// Expands folders into their files (sorted); throws Error for a path that does not exist.
std::vector<std::filesystem::path> list_documents(const std::vector<std::filesystem::path>& inputs);

// The loadable tokenizer spec for meta.json's tokenizer_spec of the token folder `data_dir`.
std::string resolve_tokenizer_spec(const std::filesystem::path& data_dir, const std::string& spec);

// True when the document with these bytes belongs to the validation split (see above).
bool is_validation_document(std::string_view bytes, double val_fraction);
// The same from the document's stable_hash64.
bool is_validation_hash(uint64_t hash, double val_fraction);

CorpusTokenizeSummary tokenize_corpus(const Tokenizer& tokenizer,
                                      const CorpusTokenizeOptions& options);

}  // namespace agora
