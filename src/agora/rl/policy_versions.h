// PolicyVersions: the recent versions of a policy being trained, for whoever needs an old one.
//
// Version v is the policy after v updates. Rollouts may come from a policy a few versions old
// (asynchronous workers, or the learner's own policy lag), and re-scoring a rollout needs the
// very version it claims. This keeps the newest `keep` + 1 versions: the live model is the
// newest, older ones are parameter snapshots loaded on demand into one scratch model.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "agora/model/llama.h"

namespace agora {

class PolicyVersions {
 public:
  // Records the live model as version `first` (its current parameters).
  PolicyVersions(Llama live, int64_t keep, uint64_t first = 0);

  // Records the live model's parameters as the next version (call after each update).
  void advance();

  uint64_t newest() const { return newest_; }
  uint64_t oldest() const { return newest_ + 1 - snapshots_.size(); }
  bool has(uint64_t version) const { return version <= newest_ && version >= oldest(); }

  // The model of `version`: the live one for the newest, else the scratch model loaded with the
  // snapshot (valid until the next call asks for another version). Error for a version not kept.
  Llama& model(uint64_t version);

 private:
  using Parameters = std::map<std::string, torch::Tensor>;
  static Parameters snapshot(Llama& model);

  Llama live_;
  int64_t keep_;
  uint64_t newest_;
  std::deque<Parameters> snapshots_;  // oldest first; the last is the newest version's
  Llama scratch_{nullptr};
  int64_t loaded_ = -1;  // the version in scratch_
};

}  // namespace agora
