// Whole-file reads and atomic writes, with errors that name the path.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace agora {

// The file's bytes. Throws Error naming the path when it cannot be opened or read.
std::string read_file(const std::filesystem::path& path);

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it over `path`, so a
// reader sees the old file or the new one, never a torn one.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

}  // namespace agora
