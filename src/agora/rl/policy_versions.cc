#include "agora/rl/policy_versions.h"

#include "agora/core/error.h"
#include "agora/train/checkpoint.h"

namespace agora {

PolicyVersions::PolicyVersions(Llama live, int64_t keep, uint64_t first)
    : live_(std::move(live)), keep_(keep), newest_(first) {
  if (keep < 0) fail("policy versions kept {} is invalid (allowed: >= 0)", keep);
  snapshots_.push_back(keep_ > 0 ? snapshot(live_) : Parameters{});
}

PolicyVersions::Parameters PolicyVersions::snapshot(Llama& model) {
  torch::NoGradGuard no_grad;
  Parameters out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

void PolicyVersions::advance() {
  ++newest_;
  // Without older versions to serve, only the count matters: no copy is made.
  snapshots_.push_back(keep_ > 0 ? snapshot(live_) : Parameters{});
  while (static_cast<int64_t>(snapshots_.size()) > keep_ + 1) snapshots_.pop_front();
}

Llama& PolicyVersions::model(uint64_t version) {
  if (!has(version)) {
    fail("policy version {} is not kept (kept: {} to {})", version, oldest(), newest_);
  }
  if (version == newest_) return live_;
  if (!scratch_) {
    scratch_ = Llama(live_->config());
    scratch_->to(live_->parameters().front().device());
    scratch_->eval();
  }
  if (loaded_ != static_cast<int64_t>(version)) {
    copy_parameters(scratch_, snapshots_[version - oldest()], "an older policy version");
    loaded_ = static_cast<int64_t>(version);
  }
  return scratch_;
}

}  // namespace agora
