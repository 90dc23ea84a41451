#include "agora/serve/param_feed.h"

#include <utility>

#include "agora/core/error.h"
#include "agora/net/envelope.h"

namespace agora::serve {

ParamFeed::ParamFeed(Limits limits, std::function<std::string()> whole, uint64_t version,
                     std::string state_hash)
    : limits_(limits),
      make_whole_(std::move(whole)),
      version_(version),
      state_hash_(std::move(state_hash)) {
  if (limits_.bytes_in_flight < 1 || limits_.bytes_per_member < 1 || limits_.deltas_kept < 1) {
    fail("parameter feed limits must be at least 1 (bytes in flight {}, per member {}, deltas {})",
         limits_.bytes_in_flight, limits_.bytes_per_member, limits_.deltas_kept);
  }
}

void ParamFeed::reset(uint64_t version, std::string state_hash) {
  version_ = version;
  state_hash_ = std::move(state_hash);
  deltas_.clear();
  whole_.reset();
}

void ParamFeed::publish(uint64_t version, std::string delta, std::string state_hash) {
  if (version != version_ + 1) {
    fail("parameter feed at version {} was given version {} (versions go up by one)", version_,
         version);
  }
  wire::Envelope e;
  wire::Params* p = e.mutable_params();
  p->set_from_version(version_);
  p->set_to_version(version);
  p->set_payload(std::move(delta));
  p->set_state_hash(state_hash);
  deltas_[version] = std::make_shared<const std::string>(net::encode_envelope(e));
  while (deltas_.size() > limits_.deltas_kept) deltas_.erase(deltas_.begin());
  version_ = version;
  state_hash_ = std::move(state_hash);
  whole_.reset();
}

ParamFeed::Answer ParamFeed::answer(net::Server& server, const std::string& route,
                                    const wire::GetParams& ask,
                                    const std::shared_ptr<std::atomic<int64_t>>& in_flight,
                                    int64_t queued) {
  Answer answer;
  const auto send = [&](const std::shared_ptr<const std::string>& bytes, int64_t& counted) {
    const auto size = static_cast<int64_t>(bytes->size());
    // One reply may always wait per member; beyond it, the member's and everyone's limits.
    if (*in_flight > 0 && (*in_flight + size > limits_.bytes_per_member ||
                           queued + size > limits_.bytes_in_flight)) {
      answer.busy = true;
      return false;
    }
    if (server.send_shared(route, bytes, in_flight) != net::Server::SendResult::kQueued) {
      answer.busy = true;
      return false;
    }
    queued += size;
    counted += size;
    return true;
  };
  const uint64_t have = ask.have_version();
  if (!ask.whole() && have == version_) return answer;  // nothing newer
  if (!ask.whole() && have < version_ && deltas_.count(have + 1) > 0) {
    for (uint64_t v = have + 1; v <= version_; ++v) {
      if (!send(deltas_.at(v), answer.delta_bytes)) break;  // it asks again, from what it has
      answer.reached = v;
    }
    return answer;
  }
  // New, too far behind, ahead of this feed (it followed a server that since went back), or
  // asking for a whole copy.
  if (!whole_) {
    wire::Envelope e;
    wire::Params* p = e.mutable_params();
    p->set_from_version(0);
    p->set_to_version(version_);
    p->set_whole(true);
    p->set_payload(make_whole_());
    p->set_state_hash(state_hash_);
    whole_ = std::make_shared<const std::string>(net::encode_envelope(e));
  }
  if (send(whole_, answer.whole_bytes)) answer.reached = version_;
  return answer;
}

ParamFollower::ParamFollower(MemberClient& client, uint64_t version, Apply apply, Heard heard)
    : client_(client), version_(version), apply_(std::move(apply)), heard_(std::move(heard)) {}

void ParamFollower::forget() {
  version_ = 0;
  whole_next_ = true;
}

bool ParamFollower::sync(uint64_t target, double wait_seconds) {
  // Parameters that failed their hash (or were forgotten) are not any version: a whole copy first.
  const auto behind = [&] { return version_ < target || whole_next_; };
  for (int attempt = 0; attempt < 6 && behind(); ++attempt) {
    wire::Envelope ask;
    ask.mutable_get_params()->set_have_version(version_);
    ask.mutable_get_params()->set_whole(whole_next_);
    client_.send(ask);
    while (behind()) {
      std::optional<wire::Envelope> m =
          client_.wait_for([](const wire::Envelope& e) { return e.has_params(); }, wait_seconds);
      if (!m) break;  // ask again
      const wire::Params& p = m->params();
      // An answer to an earlier ask, or a delta from another version: not for these parameters.
      if (p.to_version() <= version_ && !(whole_next_ && p.whole())) continue;
      if (!p.whole() && (whole_next_ || p.from_version() != version_)) continue;
      const auto size = static_cast<int64_t>(m->ByteSizeLong());
      bytes_ += size;
      std::string error;
      bool ok = false;
      try {
        ok = apply_(p) == p.state_hash();
      } catch (const Error& e) {
        error = e.what();
      }
      if (heard_) heard_(p, size, ok, error);
      if (!ok) {
        ++hash_mismatches_;
        whole_next_ = true;
        break;
      }
      version_ = p.to_version();
      whole_next_ = false;
    }
  }
  return !behind();
}

}  // namespace agora::serve
