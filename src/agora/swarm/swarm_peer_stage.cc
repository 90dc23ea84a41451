// The replica process (swarm_peer.h): its stage's parameters between replicas and the disk:
// answering GetTensor, fetching a stage hash-checked, saving and restoring it.
#include <algorithm>

#include "agora/swarm/swarm_peer_detail.h"

namespace agora::swarm_detail {

void SwarmPeer::save_state() {
  if (o_.state_dir.empty()) return;
  StageCheckpoint state;
  state.steps = static_cast<int64_t>(version_);
  for (const auto& [name, t] : demo_->state()) state.optimizer[name] = t.clone();
  save_stage_checkpoint(o_.state_dir, model_, subspace_.get(), fingerprint_, state, 2);
}

void SwarmPeer::fetch_or_restore(const wire::SwarmView& v) {
  if (step_ == 0 && version_ == 0 && hash_ == stage_hash_) {
    ready_ = true;  // the seeded start, as the others have it
    return;
  }
  if (!v.has_source()) {
    restore(v.previous_hash());
    return;
  }
  if (fetch_ && fetch_->step == step_ && fetch_->source == v.source().key() &&
      seconds_since(fetch_->started) < o_.timeout_seconds) {
    return;  // under way (a source silent for the timeout is asked again)
  }
  fetch_.reset();
  Fetch f;
  f.step = step_;
  f.source = v.source().key();
  f.expected = stage_hash_;
  f.started = Clock::now();
  try {
    f.client = std::make_unique<net::Client>(context_, identity_, v.source().endpoint(),
                                             v.source().key(), fetch_limits(), 1024);
  } catch (const Error&) {
    return;
  }
  for (const NamedParameter& p : model_->hf_parameters()) {
    wire::Envelope e;
    e.mutable_get_tensor()->set_applied_steps(step_);
    e.mutable_get_tensor()->set_name(p.name);
    f.client->send(e);
    f.missing.insert(p.name);
  }
  fetch_ = std::move(f);
}

void SwarmPeer::on_tensor(const wire::Envelope& reply) {
  if (!fetch_) return;
  if (reply.has_not_found()) {
    fetch_.reset();  // the source moved on: the next view names a source at the new step
    return;
  }
  if (!reply.has_tensor_data()) return;
  const wire::TensorData& t = reply.tensor_data();
  if (t.applied_steps() != fetch_->step || fetch_->missing.count(t.name()) == 0) return;
  for (const NamedParameter& p : model_->hf_parameters()) {
    if (p.name != t.name()) continue;
    const auto bytes = static_cast<size_t>(p.tensor.numel()) * 4;
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    if (t.dtype() != "F32" || t.data().size() != bytes || shape != p.tensor.sizes().vec()) {
      event({{"event", "fetch_refused"}, {"tensor", t.name()}, {"why", "dtype or shape"}});
      fetch_.reset();
      return;
    }
    torch::NoGradGuard no_grad;
    p.tensor.copy_(torch::from_blob(const_cast<char*>(t.data().data()), shape, torch::kFloat32));
  }
  fetch_->missing.erase(t.name());
  if (!fetch_->missing.empty()) return;
  const std::string hash = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
  if (!fetch_->expected.empty() && hash != fetch_->expected) {
    event({{"event", "fetch_refused"}, {"why", "hash"}, {"hash", hex_encode(hash)}});
    fetch_.reset();
    return;
  }
  become_ready(fetch_->step, hash, "fetched", seconds_since(fetch_->started));
  ++summary_.fetches;
  fetch_.reset();
}

void SwarmPeer::restore(const std::string& previous_hash) {
  if (o_.state_dir.empty() || seconds_since(last_restore_try_) < 1) return;
  last_restore_try_ = Clock::now();
  const auto held = stage_checkpoint_steps(o_.state_dir, stage_, fingerprint_);
  auto holds = [&](uint64_t s) { return std::find(held.begin(), held.end(), s) != held.end(); };
  uint64_t at = step_;
  std::string expected = stage_hash_;
  if (expected.empty() || !holds(at)) {
    if (step_ == 0 || previous_hash.empty() || !holds(step_ - 1)) return;
    at = step_ - 1;
    expected = previous_hash;
  }
  StageCheckpoint state;
  try {
    state = load_stage_checkpoint(o_.state_dir, static_cast<int64_t>(at), model_, fingerprint_);
  } catch (const Error& e) {  // a damaged copy: the run waits for another replica
    event({{"event", "restore_refused"}, {"version", at}, {"why", e.what()}});
    return;
  }
  const std::string hash = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
  if (hash != expected) {
    event({{"event", "restore_refused"}, {"version", at}, {"hash", hex_encode(hash)}});
    return;
  }
  demo_->load_state(state.optimizer);
  become_ready(at, hash, "restored", 0);
}

void SwarmPeer::become_ready(uint64_t step, const std::string& hash, const char* how,
                             double seconds) {
  if (std::string(how) != "restored") new_momentum();
  version_ = step;
  hash_ = hash;
  ready_ = true;
  forget_work(/*keep_forwards=*/true);  // what arrived while it fetched is for this step
  event({{"event", how},
         {"stage", stage_},
         {"version", step},
         {"hash", hex_encode(hash)},
         {"seconds", seconds}});
}

// Only the other members of this stage (a joiner the coordinator named this replica to) read its
// parameters: a stranger or a member of another stage gets not_found (a joiner this replica has
// not heard of yet asks again after its next view). Each member may ask for four whole copies at
// once and one a second after (a joiner asks again whenever the step moves on under its fetch),
// so none can crowd out the others or fill the reply queue with tensors (issue 38, finding 5).
void SwarmPeer::answer_tensor(const net::Incoming& in) {
  const wire::GetTensor& g = in.message.get_tensor();
  const bool member = stage_curves_.count(in.curve_key) != 0;
  if (!tensor_rates_.take(in.curve_key, member, now())) {
    ++ignored_;
    return;
  }
  wire::Envelope e;
  if (member && ready_ && g.applied_steps() == version_) {
    for (const NamedParameter& p : model_->hf_parameters()) {
      if (p.name != g.name()) continue;
      auto* t = e.mutable_tensor_data();
      t->set_applied_steps(version_);
      t->set_name(p.name);
      t->set_dtype("F32");
      for (int64_t d : p.tensor.sizes()) t->add_shape(d);
      t->set_data(parameter_bytes(p.tensor));
    }
  }
  if (!e.has_tensor_data()) e.mutable_not_found()->set_what(g.name());
  server_.send(in.route, e);
}

}  // namespace agora::swarm_detail
