// Fuzzes the corpus readers of agora tokenize: any bytes, plain, gzip or Zstandard, must be read
// or rejected with an Error, never crash, never hold more than the limits asked for, and never
// hand out more bytes than the stream said it read.
//
// The first input byte chooses the line limit (1 to 256 KiB), the rest is the file. Every line
// also goes through the JSON Lines reading of one line, as a corpus line would.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agora/core/error.h"
#include "agora/data/document_reader.h"
#include "agora/data/text_stream.h"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "text_stream_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t max_line = size_t{1} << (data[0] % 19);
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    auto stream = agora::TextStream::from_bytes(bytes, "fuzz");
    std::string line, text;
    agora::JsonLineParser json("text");
    uint64_t handed = 0;
    for (;;) {
      const auto got = stream.next_line(line, max_line);
      if (got == agora::TextStream::Line::kEnd) break;
      if (line.size() > max_line) bug("a line longer than the limit");
      if (got == agora::TextStream::Line::kTooLong && !line.empty()) bug("a too-long line held");
      handed += line.size();
      const auto kind = json.parse(line, text);
      if (kind == agora::JsonLine::kDocument && text.empty()) bug("an empty document");
    }
    if (handed > stream.bytes_read()) bug("more bytes handed out than read");
  } catch (const agora::Error&) {
  }
  try {
    const std::string all = agora::TextStream::from_bytes(bytes, "fuzz").read_all(max_line);
    if (all.size() > max_line) bug("read_all past its limit");
  } catch (const agora::Error&) {
  }
  return 0;
}
