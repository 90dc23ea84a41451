// The SentencePiece bridge: the only code that touches libsentencepiece, built as its own shared
// module (libagora_spm.so) and loaded at run time by spm_library.cc.
//
// Why a separate module: Debian's libsentencepiece carries a private copy of protobuf-lite 3.14
// and exports its symbols, while libtorch loads the system protobuf 3.21. Linked into one binary,
// the two copies interpose on each other and the process crashes before main() (or aborts on a
// version check). spm_library.cc therefore dlopen()s this module with RTLD_LOCAL | RTLD_DEEPBIND:
// SentencePiece binds to its own protobuf, and nothing else can see it.
//
// The functions below are extern "C" so dlsym finds them by plain names. Both sides are built by
// the same compiler against the same libstdc++ (one instance in the process), so C++ types cross
// the boundary safely; exceptions do not: every function reports failure through `error`.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace agora::spm {

// Lines of training text, pulled one at a time by the trainer. Returns false at the end.
class LineSource {
 public:
  virtual ~LineSource() = default;
  virtual bool next(std::string& line) = 0;
};

using TrainSpec = std::unordered_map<std::string, std::string>;

}  // namespace agora::spm

extern "C" {
// A loaded model, or nullptr with `error` set.
void* agora_spm_load(const char* path, std::string* error);
void agora_spm_release(void* model);
int agora_spm_piece_size(const void* model);
int agora_spm_eos_id(const void* model);
bool agora_spm_encode(const void* model, std::string_view text, std::vector<int>* ids,
                      std::string* error);
bool agora_spm_decode(const void* model, const std::vector<int>* ids, std::string* text,
                      std::string* error);
// Trains a model from `lines` with SentencePiece's trainer options `spec`; the serialized model
// goes to `model_bytes`. `seed` fixes the trainer's sentence sampling.
bool agora_spm_train(const agora::spm::TrainSpec* spec, agora::spm::LineSource* lines,
                     unsigned int seed, std::string* model_bytes, std::string* error);
}
