// PeerNetwork's fetching side: collect(), ensure() and fetch_state() on the training thread, and
// on the I/O thread asking sources, taking their replies, verifying payloads and witnessing.
#include <fmt/format.h>

#include <algorithm>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/list_bits.h"
#include "agora/peer/holder_spread.h"
#include "agora/peer/peer_network.h"
#include "agora/peer/peer_network_detail.h"

namespace agora::peer {

using detail::connection_id;
using detail::deadline_after;
using detail::endpoint_of;
using detail::now_seconds;
using detail::printable;
using detail::traffic_of;

namespace {

// Requests asked of one source at a time: half of what a server keeps waiting per connection
// (PeerServerLimits::replies_per_connection), so a second fetch of this peer's has room too.
constexpr size_t kRequestsPerSource = 32;
// How soon a request that found every connection busy (kMaxClients) is tried again.
constexpr double kPoolFullRetrySeconds = 0.02;

}  // namespace

void PeerNetwork::collect(uint64_t step, std::vector<wire::CommitRecord> commits,
                          std::vector<wire::Member> members, bool witness) {
  submit(collect_job(step, std::move(commits), members, witness));
}

std::shared_ptr<PeerNetwork::Job> PeerNetwork::collect_job(uint64_t step,
                                                           std::vector<wire::CommitRecord> commits,
                                                           const std::vector<wire::Member>& members,
                                                           bool witness) {
  double witness_seconds, arrived = now_seconds();
  {
    MutexLock lock(mutex_);
    witness_seconds = settings_.witness_seconds;
    const auto it = collect_arrived_.find(step);
    if (witness && it != collect_arrived_.end()) arrived = std::min(arrived, it->second);
  }
  auto job = std::make_shared<Job>();
  job->step = step;
  job->witness = witness;
  job->witness_at = arrived + kWitnessShare * witness_seconds;
  for (auto& record : commits) {
    Want want;
    want.key = record.payload_hash();
    want.record = record;
    // Several sources must fit before the Witness is due.
    want.timeout = std::min(options_.blob_timeout_seconds, kSourceShare * witness_seconds);
    want.retry_refused = !witness;  // ensure(): we may not be listed yet
    want.request.mutable_get_blob()->set_hash(record.payload_hash());
    // The author first (the coordinator's relay for one nobody can dial), then everyone else
    // in the members' order but those nobody can dial, then the relay as a last resort (an
    // author found unreachable after this list was made).
    wire::Member relay;
    relay.set_key(options_.coordinator_key);
    relay.set_endpoint(options_.coordinator);
    for (const auto& m : members) {
      if (m.key() == record.author()) want.sources.push_back(m.relayed() ? relay : m);
    }
    for (const auto& m : members) {
      if (m.key() != record.author() && m.key() != identity_.public_key() && !m.relayed()) {
        want.sources.push_back(m);
      }
    }
    if (want.sources.empty() || want.sources.front().key() != relay.key()) {
      want.sources.push_back(relay);
    }
    // Bytes held for another step are not this commitment's payload (they carry their step):
    // they are fetched and validated like any other, and refused.
    if (blobs_.holds(want.key, record.step())) want.done = want.ok = true;
    job->wants.push_back(std::move(want));
  }
  return job;
}

bool PeerNetwork::wait_for(Job& job, double timeout_seconds, const std::atomic<bool>* cancel) {
  const auto deadline = deadline_after(timeout_seconds);
  MutexLock lock(mutex_);
  while (!job.finished && !(cancel != nullptr && cancel->load())) {
    // With a cancel flag, look at it every 0.2 s.
    const auto until = cancel == nullptr ? deadline : std::min(deadline, deadline_after(0.2));
    if (arrived_.wait_until(mutex_, until) == std::cv_status::timeout && until == deadline) break;
  }
  job.cancelled = !job.finished;
  return job.finished;
}

bool PeerNetwork::fetch_batched(std::vector<Want>& wants, size_t batch, double timeout_seconds,
                                const std::atomic<bool>* cancel) {
  const double end = now_seconds() + timeout_seconds;
  for (size_t first = 0; first < wants.size(); first += batch) {
    const size_t last = std::min(wants.size(), first + batch);
    auto job = std::make_shared<Job>();
    for (size_t i = first; i < last; ++i) job->wants.push_back(std::move(wants[i]));
    submit(job);
    if (!wait_for(*job, std::max(0.0, end - now_seconds()), cancel)) return false;
    for (size_t i = first; i < last; ++i) wants[i] = std::move(job->wants[i - first]);
  }
  return true;
}

void PeerNetwork::submit(std::shared_ptr<Job> job) {
  MutexLock lock(mutex_);
  new_jobs_.push_back(std::move(job));
}

std::vector<std::string> PeerNetwork::ensure(uint64_t step,
                                             const std::vector<wire::CommitRecord>& set,
                                             std::vector<wire::Member> members,
                                             double timeout_seconds) {
  std::vector<wire::CommitRecord> missing;
  for (const auto& record : set) {
    if (!blobs_.holds(record.payload_hash(), record.step())) missing.push_back(record);
  }
  if (missing.empty()) return {};
  const auto job = collect_job(step, missing, members, /*witness=*/false);
  submit(job);
  wait_for(*job, timeout_seconds);
  std::vector<std::string> still;
  for (const auto& record : missing) {
    if (!blobs_.holds(record.payload_hash(), record.step())) {
      still.push_back(record.payload_hash());
    }
  }
  return still;
}

Snapshot PeerNetwork::fetch_strategy_state(const std::string& hash,
                                           const std::vector<std::string>& names,
                                           const wire::Member& author, double timeout_seconds,
                                           const std::atomic<bool>* cancel) {
  std::vector<Want> wants;
  for (const std::string& name : names) {
    Want want;
    want.key = name;
    want.timeout = std::min(options_.tensor_timeout_seconds, timeout_seconds);
    auto* get = want.request.mutable_get_tensor();
    get->set_strategy_hash(hash);
    get->set_name(name);
    want.sources.push_back(author);  // nobody else holds it
    wants.push_back(std::move(want));
  }
  if (!fetch_batched(wants, kRequestsPerSource, timeout_seconds, cancel)) {
    if (cancel != nullptr && cancel->load()) fail("the fetch was cancelled");
    fail("the author did not serve its strategy state within {} s", timeout_seconds);
  }
  Snapshot out;
  for (Want& want : wants) {
    if (!want.ok && want.not_found) {
      throw StateNotServed(fmt::format("strategy tensor {}: {}", printable(want.key), want.reason));
    }
    if (!want.ok) fail("strategy tensor {}: {}", printable(want.key), want.reason);
    out[want.key] = std::move(want.tensor);
  }
  return out;
}

std::string PeerNetwork::fetch_strategy_manifest(const std::string& hash,
                                                 const wire::Member& author, double timeout_seconds,
                                                 const std::atomic<bool>* cancel) {
  std::vector<Want> wants(1);
  Want& want = wants.front();
  want.key = hash;
  want.manifest = true;
  want.timeout = std::min(options_.tensor_timeout_seconds, timeout_seconds);
  want.request.mutable_get_blob()->set_hash(hash);
  want.sources.push_back(author);
  if (!fetch_batched(wants, kRequestsPerSource, timeout_seconds, cancel)) {
    if (cancel != nullptr && cancel->load()) fail("the fetch was cancelled");
    fail("the author did not serve its strategy state's manifest within {} s", timeout_seconds);
  }
  if (!want.ok && want.not_found) throw StateNotServed("its manifest: " + want.reason);
  if (!want.ok) fail("its manifest: {}", want.reason);
  return std::move(want.tensor.data);
}

Snapshot PeerNetwork::fetch_state(const wire::StateRecord& state,
                                  const std::vector<wire::Member>& holders,
                                  double timeout_seconds) {
  if (state.tensor_names_size() != state.tensor_hashes_size()) {
    fail("the coordinator's state record lists {} tensors but {} hashes", state.tensor_names_size(),
         state.tensor_hashes_size());
  }
  // Holders nobody can dial serve through the coordinator's relay, chunk by chunk: slower, so
  // only for what the others could not serve.
  std::vector<wire::Member> others, relayed;
  for (const auto& h : holders) {
    if (h.key() == identity_.public_key()) continue;
    (h.relayed() ? relayed : others).push_back(h);
  }
  if (others.empty() && relayed.empty()) {
    fail("no member holds the parameters after step {}", state.applied_steps());
  }
  const double started = now_seconds();
  Snapshot out;
  std::vector<int> missing;
  if (others.empty()) {
    for (int i = 0; i < state.tensor_names_size(); ++i) missing.push_back(i);
    fetch_relayed(state, std::move(missing), relayed, timeout_seconds, out);
    if (state_fetch_ != nullptr) state_fetch_->observe(now_seconds() - started);
    return out;
  }
  // A holder that never answers (gone, or hostile) costs each tensor it was asked for one
  // timeout before the next holder is asked: as long as the largest tensor needs at 1 MB/s,
  // within [10 s, tensor_timeout_seconds], rather than always the longest.
  uint64_t largest = 0;
  std::map<std::string, uint64_t> sizes;
  {
    MutexLock lock(mutex_);
    largest = settings_.max_tensor_bytes;
    sizes = settings_.tensor_bytes;
  }
  const double per_source = largest == 0 ? options_.tensor_timeout_seconds
                                         : std::clamp(static_cast<double>(largest) / 1e6, 10.0,
                                                      options_.tensor_timeout_seconds);
  // Largest tensors first, each asked first of the holder with the fewest bytes asked of it so
  // far (holder_spread.h); the other holders follow as fallbacks, in turn.
  std::vector<int> order;  // tensor indices, as the wants are
  for (int i = 0; i < state.tensor_names_size(); ++i) order.push_back(i);
  const auto size_of = [&](int i) {
    const auto it = sizes.find(state.tensor_names(i));
    return it == sizes.end() ? uint64_t{1} : it->second;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return size_of(a) > size_of(b); });
  std::vector<uint64_t> ordered_bytes;
  for (int i : order) ordered_bytes.push_back(size_of(i));
  const std::vector<size_t> firsts =
      spread_over_holders(ordered_bytes, others.size(), kRequestsPerSource);
  const size_t batch = kRequestsPerSource * others.size();
  std::vector<Want> wants;
  for (size_t w = 0; w < order.size(); ++w) {
    const int i = order[w];
    const size_t first = firsts[w];
    Want want;
    want.key = state.tensor_names(i);
    want.expected_hash = state.tensor_hashes(i);
    want.timeout = per_source;
    // A joiner is listed in the holders' member lists from the next RoundStart on.
    want.retry_refused = true;
    auto* get = want.request.mutable_get_tensor();
    get->set_applied_steps(state.applied_steps());
    get->set_name(want.key);
    for (size_t k = 0; k < others.size(); ++k) {
      want.sources.push_back(others[(first + k) % others.size()]);
    }
    wants.push_back(std::move(want));
  }
  if (!fetch_batched(wants, batch, timeout_seconds) && relayed.empty()) {
    fail("fetching the parameters after step {} took longer than {} s", state.applied_steps(),
         timeout_seconds);
  }
  for (size_t w = 0; w < wants.size(); ++w) {
    Want& want = wants[w];
    if (want.ok) {
      out[want.key] = std::move(want.tensor);
    } else if (relayed.empty()) {
      fail("tensor {} of the parameters after step {}: {}", printable(want.key),
           state.applied_steps(), want.reason);
    } else {
      missing.push_back(order[w]);
    }
  }
  std::sort(missing.begin(), missing.end());
  if (!missing.empty()) {
    fetch_relayed(state, std::move(missing), relayed,
                  std::max(0.0, timeout_seconds - (now_seconds() - started)), out);
  }
  if (state_fetch_ != nullptr) state_fetch_->observe(now_seconds() - started);
  return out;
}

namespace {

// Remembers `source` once (a joiner's retries ask the same holders again and again).
void remember(std::vector<std::string>& asked_before, std::string& source) {
  if (!source.empty() &&
      std::find(asked_before.begin(), asked_before.end(), source) == asked_before.end()) {
    asked_before.push_back(std::move(source));
  }
  source.clear();
}

}  // namespace

void PeerNetwork::advance(Want& want, double now) {
  remember(want.asked_before, want.asked);
  while (want.next_source < want.sources.size()) {
    const wire::Member& source = want.sources[want.next_source++];
    if (source.key() == identity_.public_key()) continue;
    try {
      net::Client* client = client_for(source);
      if (client == nullptr) {
        // Every connection waits on an answer: ask this source again shortly.
        --want.next_source;
        want.retry_at = now + kPoolFullRetrySeconds;
        return;
      }
      client->send(want.request);
      count(traffic_of(want.request), true, want.request.ByteSizeLong());
      if (want.started == 0) want.started = now;
    } catch (const Error& e) {
      want.reason = e.what();
      continue;
    }
    want.asked = connection_id(source);
    want.deadline = now + want.timeout;
    return;
  }
  if (want.refused && want.retry_refused) {
    want.refused = false;
    want.next_source = 0;
    want.retry_at = now + 1;
    return;
  }
  want.done = true;
  if (want.reason.empty()) want.reason = "no member could serve it";
  if (want.request.has_get_blob()) reject(Rejection::kUnavailable);
}

void PeerNetwork::expire_wants(double now) {
  for (auto& job : jobs_) {
    for (Want& want : job->wants) {
      if (want.done) continue;
      if (want.retry_at > 0 && now >= want.retry_at) {
        want.retry_at = 0;
        advance(want, now);
      } else if (!want.asked.empty() && now > want.deadline) {
        ++pool_events_;  // that source's connection is no longer asked
        const std::string& endpoint = want.sources[want.next_source - 1].endpoint();
        want.reason =
            fmt::format("{} did not answer within {} s", printable(endpoint), want.timeout);
        advance(want, now);
      }
    }
  }
}

void PeerNetwork::on_blob(Job& job, Want& want, const std::string& source, wire::Blob& blob,
                          double now) {
  const std::string endpoint = endpoint_of(source);
  std::string data = std::move(*blob.mutable_data());
  LinkSettings settings;
  {
    MutexLock lock(mutex_);
    settings.run_id = settings_.run_id;
    settings.validator = settings_.validator;
    settings.max_payload_bytes = settings_.max_payload_bytes;
  }
  const bool oversized = settings.max_payload_bytes > 0 && data.size() > settings.max_payload_bytes;
  if (oversized || blake2b256_bytes(data) != want.key) {
    reject(Rejection::kHash);
    bump(&NetworkCounters::payloads_rejected);
    // A relay (or the author) sent bytes that are not the committed payload: ask another.
    want.reason =
        fmt::format("{} served bytes that do not match the committed hash", printable(endpoint));
    if (want.asked == source) advance(want, now);  // else the source asked now may still serve
    return;
  }
  if (want.manifest) {  // its hash is the author's signed commitment: nothing else to check
    remember(want.asked_before, want.asked);
    want.tensor.data = std::move(data);
    want.done = want.ok = true;
    return;
  }
  const wire::CommitRecord& r = want.record;
  std::optional<std::string> invalid;  // why the payload is refused, if it is
  if (!net::verify_signature(r.author(),
                             net::commit_signing_bytes(settings.run_id, r.step(), want.key),
                             r.signature())) {
    invalid = "the author's signature over the commitment does not verify";
    reject(Rejection::kSignature);
  } else if (settings.validator && (invalid = settings.validator(want.key, data, r.step()))) {
    reject(Rejection::kLayout);
  }
  remember(want.asked_before, want.asked);
  want.done = true;
  want.ok = !invalid;
  if (invalid) want.reason = std::move(*invalid);
  if (want.ok && payload_fetch_ != nullptr) payload_fetch_->observe(now - want.started);
  bump(want.ok ? &NetworkCounters::payloads_fetched : &NetworkCounters::payloads_rejected);
  if (want.ok && job.witnessed) bump(&NetworkCounters::payloads_late);
  if (want.ok) blobs_.put(want.key, std::move(data), r.step());
}

void PeerNetwork::on_reply(const std::string& source, wire::Envelope&& reply) {
  const double now = now_seconds();
  const std::string endpoint = endpoint_of(source);
  const auto asked_here = [&](const Want& want) {
    return want.asked == source || std::find(want.asked_before.begin(), want.asked_before.end(),
                                             source) != want.asked_before.end();
  };
  if (reply.has_refused()) {
    // That source does not count us as a member (yet): whatever else we asked it is refused too.
    bool any = false;
    for (auto& job : jobs_) {
      for (Want& want : job->wants) {
        if (want.done || want.asked != source) continue;
        want.refused = any = true;
        want.reason = fmt::format("{} does not count this peer as a member", printable(endpoint));
        advance(want, now);
      }
    }
    if (!any) bump(&NetworkCounters::unsolicited_replies);
    return;
  }
  for (auto& job : jobs_) {
    for (Want& want : job->wants) {
      if (want.done || !asked_here(want)) continue;
      if (reply.has_not_found() && want.asked == source && reply.not_found().what() == want.key) {
        want.reason = fmt::format("{} does not have it", printable(endpoint));
        want.not_found = true;
        advance(want, now);
        return;
      }
      if (reply.has_blob() && want.request.has_get_blob() && reply.blob().hash() == want.key) {
        on_blob(*job, want, source, *reply.mutable_blob(), now);
        return;
      }
      const wire::GetTensor& asked = want.request.get_tensor();
      if (reply.has_tensor_data() && want.request.has_get_tensor() &&
          reply.tensor_data().name() == asked.name() &&
          reply.tensor_data().applied_steps() == asked.applied_steps() &&
          reply.tensor_data().strategy_hash() == asked.strategy_hash() &&
          reply.tensor_data().offset() == asked.offset() &&
          reply.tensor_data().holder() == asked.holder()) {
        auto& t = *reply.mutable_tensor_data();
        want.total_bytes = t.total_bytes();  // a relayed chunk's; fetch_relayed checks the rest
        // A strategy state is checked whole, by the caller (fetch_strategy_state).
        if (!want.expected_hash.empty() && blake2b256_bytes(t.data()) != want.expected_hash) {
          want.reason = fmt::format("{} served a tensor that does not match the majority's hash",
                                    printable(endpoint));
          if (want.asked == source) advance(want, now);
          return;
        }
        want.tensor.dtype = t.dtype();
        want.tensor.shape.assign(t.shape().begin(), t.shape().end());
        want.tensor.data = std::move(*t.mutable_data());
        want.done = want.ok = true;
        want.asked.clear();
        return;
      }
    }
  }
  bump(&NetworkCounters::unsolicited_replies);
}

void PeerNetwork::finish_jobs(double now) {
  std::vector<wire::Envelope> witnesses;
  {
    MutexLock lock(mutex_);  // Job::finished and Job::cancelled
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = **it;
      bool all = true;
      for (const Want& want : job.wants) all = all && want.done;
      if (job.witness && !job.witnessed && (all || now >= job.witness_at)) {
        // What is held now, and what was refused; a payload still being fetched is neither.
        // One bit per commit of the Collect (proto Witness.of_collect): the job's wants are its
        // commits, in its order.
        wire::Envelope e;
        auto* w = e.mutable_witness();
        w->set_step(job.step);
        std::string held = list_bits(job.wants.size());
        for (size_t i = 0; i < job.wants.size(); ++i) {
          const Want& want = job.wants[i];
          if (want.ok) {
            set_list_bit(held, i);
          } else if (want.done) {
            auto* r = w->add_rejected();
            r->set_author(want.record.author());
            r->set_reason(want.reason);
          }
        }
        w->set_of_collect(std::move(held));
        if (!all) ++counters_.witnesses_early;
        witnesses.push_back(std::move(e));
        job.witnessed = true;
      }
      if (!all && !job.cancelled) {
        ++it;
        continue;
      }
      job.finished = true;
      it = jobs_.erase(it);
    }
  }
  arrived_.notify_all();
  for (const auto& w : witnesses) {
    count(Traffic::kControl, true, w.ByteSizeLong());
    coordinator_->send(w);
  }
}

}  // namespace agora::peer
