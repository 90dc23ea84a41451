// The documents of a corpus, one after another, from files as people have them.
//
// A file is read in one of three ways:
// - JSON Lines, when its name ends in .jsonl or .ndjson (after a .gz, .zst or .zstd suffix, so
//   web corpora such as shard_00.jsonl.zst are JSON Lines): each line is one JSON object and its
//   string under `field` ("text" unless told) is one document;
// - one document per non-empty line, with `lines` set (a corpus of short items);
// - otherwise the whole file is one document.
// Any of them may be gzip- or Zstandard-compressed (data/text_stream.h recognises which).
//
// Promises:
// - The same files and options give the same documents in the same order, on any machine.
// - A JSON Lines line that yields no document is counted by why (not JSON, not an object,
//   without the field, the field not a string, an empty string, blank, too long) with the first
//   few as "file:line: reason", never dropped unseen; a line and a document are bounded by
//   `max_document_bytes` (longer lines are skipped and counted, a longer whole file is an Error).
// - Memory holds one document at a time (and the stream's buffers), whatever the corpus's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agora/data/text_stream.h"

namespace agora {

enum class DocumentFormat { kWholeFile, kLines, kJsonLines };

const char* to_string(DocumentFormat format);

// How `file` is read (see above).
DocumentFormat document_format(const std::filesystem::path& file, bool lines);

// What one JSON Lines line gives: a document, or why not.
enum class JsonLine { kDocument, kBlank, kNotJson, kNotObject, kNoField, kNotString, kEmpty };

// Reads JSON Lines lines as JSON objects whose string under `field` is the document. simdjson
// validates each whole line (structure and UTF-8) at gigabytes a second; a line it refuses is
// judged again by nlohmann's parser, so that valid JSON simdjson cannot hold (an integer past
// 64 bits) still gives its document. A key that appears twice gives its first value.
class JsonLineParser {
 public:
  explicit JsonLineParser(std::string field);
  ~JsonLineParser();
  JsonLineParser(JsonLineParser&&) noexcept;

  // `line` may gain capacity (the parser reads a little past the end); the text goes to `text`.
  JsonLine parse(std::string& line, std::string& text);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct DocumentReaderOptions {
  bool lines = false;
  std::string field = "text";
  size_t max_document_bytes = size_t{256} << 20;
};

// JSON Lines lines that gave no document, by reason.
struct SkippedLines {
  uint64_t not_json = 0;
  uint64_t not_object = 0;
  uint64_t no_field = 0;
  uint64_t not_string = 0;
  uint64_t empty = 0;
  uint64_t blank = 0;
  uint64_t too_long = 0;
  std::vector<std::string> examples;  // the first kExamples, "file:line: reason"

  static constexpr size_t kExamples = 5;
  uint64_t total() const;
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::filesystem::path> files, DocumentReaderOptions options);

  // The next document into `text`; false after the last. Errors name the file.
  bool next(std::string& text);

  const SkippedLines& skipped() const { return skipped_; }
  // Documents read per format so far.
  uint64_t documents(DocumentFormat format) const;
  // Bytes taken from the files so far, as stored (compressed where they are).
  uint64_t input_bytes() const;

 private:
  void skip(std::string_view reason, uint64_t SkippedLines::*counter);

  std::vector<std::filesystem::path> files_;
  DocumentReaderOptions options_;
  size_t next_file_ = 0;
  std::optional<TextStream> stream_;  // the file being read line by line
  DocumentFormat format_ = DocumentFormat::kWholeFile;
  uint64_t line_number_ = 0;
  std::string line_;
  JsonLineParser json_;
  SkippedLines skipped_;
  uint64_t documents_[3] = {0, 0, 0};
  uint64_t input_bytes_done_ = 0;  // of the files already finished
};

}  // namespace agora
