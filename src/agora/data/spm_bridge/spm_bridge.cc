#include "agora/data/spm_bridge/spm_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>

namespace {

using sentencepiece::SentencePieceProcessor;

class SourceIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit SourceIterator(agora::spm::LineSource* source) : source_(source) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !source_->next(line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  agora::spm::LineSource* source_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

extern "C" {

void* agora_spm_load(const char* path, std::string* error) {
  auto processor = std::make_unique<SentencePieceProcessor>();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return processor.release();
}

void agora_spm_release(void* model) {
  delete static_cast<SentencePieceProcessor*>(model);
}

int agora_spm_piece_size(const void* model) {
  return static_cast<const SentencePieceProcessor*>(model)->GetPieceSize();
}

int agora_spm_eos_id(const void* model) {
  return static_cast<const SentencePieceProcessor*>(model)->eos_id();
}

bool agora_spm_encode(const void* model, std::string_view text, std::vector<int>* ids,
                      std::string* error) {
  try {
    const auto status = static_cast<const SentencePieceProcessor*>(model)->Encode(text, ids);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

bool agora_spm_decode(const void* model, const std::vector<int>* ids, std::string* text,
                      std::string* error) {
  try {
    const auto status = static_cast<const SentencePieceProcessor*>(model)->Decode(*ids, text);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

bool agora_spm_train(const agora::spm::TrainSpec* spec, agora::spm::LineSource* lines,
                     unsigned int seed, std::string* model_bytes, std::string* error) {
  try {
    sentencepiece::SetRandomGeneratorSeed(seed);
    SourceIterator iterator(lines);
    const auto status = sentencepiece::SentencePieceTrainer::Train(*spec, &iterator, model_bytes);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // extern "C"
