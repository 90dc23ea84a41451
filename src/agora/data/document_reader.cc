#include "agora/data/document_reader.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/core/error.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

}  // namespace

const char* to_string(DocumentFormat format) {
  switch (format) {
    case DocumentFormat::kWholeFile: return "whole file";
    case DocumentFormat::kLines: return "lines";
    case DocumentFormat::kJsonLines: return "JSON Lines";
  }
  return "?";
}

DocumentFormat document_format(const fs::path& file, bool lines) {
  std::string name = file.filename().string();
  for (const char* compressed : {".gz", ".zst", ".zstd"}) {
    if (ends_with(name, compressed)) {
      name.resize(name.size() - std::string_view(compressed).size());
      break;
    }
  }
  if (ends_with(name, ".jsonl") || ends_with(name, ".ndjson")) return DocumentFormat::kJsonLines;
  return lines ? DocumentFormat::kLines : DocumentFormat::kWholeFile;
}

JsonLine json_line_document(const std::string& line, const std::string& field, std::string& text) {
  if (blank(line)) return JsonLine::kBlank;
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return JsonLine::kNotJson;
  if (!json.is_object()) return JsonLine::kNotObject;
  const auto found = json.find(field);
  if (found == json.end()) return JsonLine::kNoField;
  if (!found->is_string()) return JsonLine::kNotString;
  text = found->get<std::string>();
  return text.empty() ? JsonLine::kEmpty : JsonLine::kDocument;
}

uint64_t SkippedLines::total() const {
  return not_json + not_object + no_field + not_string + empty + blank + too_long;
}

DocumentReader::DocumentReader(std::vector<fs::path> files, DocumentReaderOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  if (options_.field.empty()) fail("--field is empty (expected the JSON key holding the text)");
}

uint64_t DocumentReader::documents(DocumentFormat format) const {
  return documents_[static_cast<int>(format)];
}

void DocumentReader::skip(std::string_view reason, uint64_t SkippedLines::*counter) {
  ++(skipped_.*counter);
  if (skipped_.examples.size() < SkippedLines::kExamples) {
    skipped_.examples.push_back(
        fmt::format("{}:{}: {}", files_[next_file_ - 1].string(), line_number_, reason));
  }
}

bool DocumentReader::next(std::string& text) {
  for (;;) {
    if (!stream_) {
      if (next_file_ == files_.size()) return false;
      const fs::path& file = files_[next_file_++];
      format_ = document_format(file, options_.lines);
      TextStream stream = TextStream::open(file);
      if (format_ == DocumentFormat::kWholeFile) {
        text = stream.read_all(options_.max_document_bytes);
        ++documents_[static_cast<int>(format_)];
        return true;
      }
      stream_.emplace(std::move(stream));
      line_number_ = 0;
    }
    const TextStream::Line got = stream_->next_line(line_, options_.max_document_bytes);
    if (got == TextStream::Line::kEnd) {
      stream_.reset();
      continue;
    }
    ++line_number_;
    if (got == TextStream::Line::kTooLong) {
      skip("longer than the most a document may have", &SkippedLines::too_long);
      continue;
    }
    if (format_ == DocumentFormat::kLines) {
      if (line_.empty()) continue;  // lines are separators here, not items
      text = std::move(line_);
      ++documents_[static_cast<int>(format_)];
      return true;
    }
    switch (json_line_document(line_, options_.field, text)) {
      case JsonLine::kDocument:
        break;
      case JsonLine::kBlank:
        skip("a blank line", &SkippedLines::blank);
        continue;
      case JsonLine::kNotJson:
        skip("not JSON", &SkippedLines::not_json);
        continue;
      case JsonLine::kNotObject:
        skip("not a JSON object", &SkippedLines::not_object);
        continue;
      case JsonLine::kNoField:
        skip(fmt::format("no \"{}\" field", options_.field), &SkippedLines::no_field);
        continue;
      case JsonLine::kNotString:
        skip(fmt::format("\"{}\" is not a string", options_.field), &SkippedLines::not_string);
        continue;
      case JsonLine::kEmpty:
        skip("an empty text", &SkippedLines::empty);
        continue;
    }
    ++documents_[static_cast<int>(format_)];
    return true;
  }
}

}  // namespace agora
