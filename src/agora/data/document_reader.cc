#include "agora/data/document_reader.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <nlohmann/json.hpp>

#include "agora/core/error.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

}  // namespace

const char* to_string(DocumentFormat format) {
  switch (format) {
    case DocumentFormat::kWholeFile:
      return "whole file";
    case DocumentFormat::kLines:
      return "lines";
    case DocumentFormat::kJsonLines:
      return "JSON Lines";
  }
  return "?";
}

DocumentFormat document_format(const fs::path& file, bool lines) {
  std::string name = file.filename().string();
  for (const char* compressed : {".gz", ".zst", ".zstd"}) {
    if (name.ends_with(compressed)) {
      name.resize(name.size() - std::string_view(compressed).size());
      break;
    }
  }
  if (name.ends_with(".jsonl") || name.ends_with(".ndjson")) return DocumentFormat::kJsonLines;
  return lines ? DocumentFormat::kLines : DocumentFormat::kWholeFile;
}

struct JsonLineParser::Impl {
  explicit Impl(std::string f) : field(std::move(f)) {}
  std::string field;
  simdjson::dom::parser parser;
};

JsonLineParser::JsonLineParser(std::string field)
    : impl_(std::make_unique<Impl>(std::move(field))) {}
JsonLineParser::~JsonLineParser() = default;
JsonLineParser::JsonLineParser(JsonLineParser&&) noexcept = default;

JsonLine JsonLineParser::parse(std::string& line, std::string& text) {
  if (blank(line)) return JsonLine::kBlank;
  const size_t size = line.size();
  line.reserve(size + simdjson::SIMDJSON_PADDING);
  simdjson::dom::element root;
  if (impl_->parser.parse(line.data(), size, /*realloc_if_needed=*/false).get(root) ==
      simdjson::SUCCESS) {
    simdjson::dom::object object;
    if (root.get_object().get(object) != simdjson::SUCCESS) return JsonLine::kNotObject;
    simdjson::dom::element value;
    if (object.at_key(impl_->field).get(value) != simdjson::SUCCESS) return JsonLine::kNoField;
    std::string_view found;
    if (value.get_string().get(found) != simdjson::SUCCESS) return JsonLine::kNotString;
    text.assign(found);
    return text.empty() ? JsonLine::kEmpty : JsonLine::kDocument;
  }
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return JsonLine::kNotJson;
  if (!json.is_object()) return JsonLine::kNotObject;
  const auto found = json.find(impl_->field);
  if (found == json.end()) return JsonLine::kNoField;
  if (!found->is_string()) return JsonLine::kNotString;
  text = found->get<std::string>();
  return text.empty() ? JsonLine::kEmpty : JsonLine::kDocument;
}

uint64_t SkippedLines::total() const {
  return not_json + not_object + no_field + not_string + empty + blank + too_long;
}

DocumentReader::DocumentReader(std::vector<fs::path> files, DocumentReaderOptions options)
    : files_(std::move(files)), options_(std::move(options)), json_(options_.field) {
  if (options_.field.empty()) fail("--field is empty (expected the JSON key holding the text)");
}

uint64_t DocumentReader::documents(DocumentFormat format) const {
  return documents_[static_cast<int>(format)];
}

uint64_t DocumentReader::input_bytes() const {
  return input_bytes_done_ + (stream_ ? stream_->input_bytes_read() : 0);
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
        input_bytes_done_ += stream.input_bytes_read();
        ++documents_[static_cast<int>(format_)];
        return true;
      }
      stream_.emplace(std::move(stream));
      line_number_ = 0;
    }
    const TextStream::Line got = stream_->next_line(line_, options_.max_document_bytes);
    if (got == TextStream::Line::kEnd) {
      input_bytes_done_ += stream_->input_bytes_read();
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
    switch (json_.parse(line_, text)) {
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
