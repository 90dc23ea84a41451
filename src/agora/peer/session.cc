#include "agora/peer/session.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "agora/core/error.h"
#include "agora/data/data_identity.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/optim/payload.h"
#include "agora/train/device.h"

namespace agora::peer {

using Clock = std::chrono::steady_clock;

wire::Welcome join(PeerContext& peer) {
  peer.phase = PeerPhase::kJoining;
  wire::Envelope join;
  join.mutable_join()->set_key(peer.identity.public_key());
  join.mutable_join()->set_endpoint(peer.link.endpoint());
  join.mutable_join()->set_agent("agora 0.1.0");
  join.mutable_join()->set_applied_steps(peer.applied);
  auto last_sent = Clock::now() - std::chrono::hours(1);
  const auto started = Clock::now();
  const auto timeout = std::chrono::duration<double>(peer.options.join_timeout_seconds);
  while (!peer.stopping()) {
    if (Clock::now() - started > timeout) {
      fail(
          "no answer from the coordinator at {} within {:.0f} s; check the address and its key, "
          "that its port is reachable through firewalls, and that this peer's public key ({}) "
          "is on the run's allowlist",
          peer.options.coordinator, peer.options.join_timeout_seconds,
          net::key_to_hex(peer.identity.public_key()));
    }
    if (Clock::now() - last_sent > std::chrono::seconds(5)) {
      peer.link.send_to_coordinator(join);
      last_sent = Clock::now();
    }
    auto m = peer.link.next_from_coordinator(0.2);
    if (!m) continue;
    if (m->has_welcome()) return m->welcome();
    // may_rejoin answers a message that overtook the Join; anything else is final.
    if (m->has_refused() && !m->refused().may_rejoin()) {
      fail("the coordinator refused this peer: {}", m->refused().reason());
    }
    if (m->has_finished()) fail("the run has finished ({} steps)", m->finished().steps());
  }
  fail("stopped before joining");
}

namespace {

// No copy of the run's data here: fetch it from the coordinator as it is read, checked against
// the run's data hash (serve/data_mount.h).
void mount_run_data(PeerContext& peer) {
  RunConfig& config = peer.config;
  if (config.data.hash.empty()) {
    fail(
        "this peer has no copy of the run's data (no --data, and the run's data.dir {} is not on "
        "this machine), and the coordinator does not serve it (its run config names no data "
        "hash); pass --data DIR with a copy of the run's token folder",
        config.data.dir);
  }
  serve::DataMountOptions o;
  o.endpoint = peer.options.coordinator;
  o.server_key = peer.options.coordinator_key;
  o.data_hash = config.data.hash;
  o.cache_dir = peer.options.data_cache.empty()
                    ? std::filesystem::path("agora-data") / config.data.hash.substr(0, 16)
                    : peer.options.data_cache;
  o.max_peers = peer.options.data_peers;
  o.progress = [&peer](const std::string& line) { peer.log(line, "data_progress"); };
  peer.data_mount = serve::DataMount::open(peer.identity, o);
  const serve::DataMountStats s = peer.data_mount->stats();
  peer.log(fmt::format("fetching the run's data {} into {} ({:.1f} MiB, {} of {} chunks already "
                       "held)",
                       config.data.hash.substr(0, 16), o.cache_dir.string(),
                       static_cast<double>(s.bytes) / (1 << 20), s.chunks_cached, s.chunks),
           "data_mount",
           {{"cache", o.cache_dir.string()},
            {"bytes", s.bytes},
            {"chunks", s.chunks},
            {"chunks_cached", s.chunks_cached}});
  config.data.dir = o.cache_dir.string();
  peer.link.serve_data(
      [mount = peer.data_mount](const std::string& hash) { return mount->held_chunk(hash); });
}

// A copy on disk: held to the run's data hash, then served to the members that fetch.
void serve_local_data(PeerContext& peer) {
  const RunConfig& config = peer.config;
  peer.data_service = std::make_shared<serve::DataService>(config.data.dir);
  if (peer.data_service->hex() != config.data.hash) {
    check_data_identity(config.data.dir, config.data.hash);  // names both hashes
  }
  peer.link.serve_data(
      [data = peer.data_service](const std::string& hash) { return data->chunk(hash); });
}

}  // namespace

void offer_data_peers(PeerContext& peer, const std::vector<wire::Member>& members) {
  if (!peer.data_mount) return;
  std::vector<serve::DataPeer> holders;
  for (const wire::Member& m : members) {
    if (m.key() != peer.identity.public_key() && !m.relayed() && !m.endpoint().empty()) {
      holders.push_back({m.endpoint(), m.key()});
    }
  }
  peer.data_mount->set_peers(std::move(holders));
}

void share_decoded_payloads(PeerContext& peer) {
  if (peer.decoded == nullptr) return;
  dynamic_cast<DecoupledMomentum&>(*peer.learner.strategy).share_decoded_payloads(peer.decoded);
}

void build(PeerContext& peer, const wire::Welcome& welcome) {
  RunConfig& config = peer.config;
  config = RunConfig::parse(welcome.run_config_toml(), "the coordinator's run config");
  check_decentralized(config);
  if (!peer.options.data.empty()) config.data.dir = peer.options.data.string();
  std::error_code ec;
  if (peer.options.data.empty() &&
      (!peer.options.data_cache.empty() || !std::filesystem::is_directory(config.data.dir, ec))) {
    mount_run_data(peer);
    // Before the first round names them: the members holding the run's state.
    offer_data_peers(peer, {welcome.holders().begin(), welcome.holders().end()});
  } else if (!config.data.hash.empty()) {
    serve_local_data(peer);
  }
  peer.data = read_data_meta(config.data.dir);
  if (config.model.vocab_size == 0) config.set_vocab_size(peer.data.vocab_size);
  const int64_t threads = peer.options.threads > 0 ? peer.options.threads : config.train.threads;
  torch::set_num_threads(threads > 0 ? static_cast<int>(threads)
                                     : static_cast<int>(std::thread::hardware_concurrency()));
  peer.run_id = welcome.run_id();
  peer.checkpointer = welcome.checkpointer();
  peer.device = resolve_device(config.train.device);
  peer.learner = Learner::create(config, peer.device);
  peer.step = std::make_unique<TrainStep>(config, peer.device);
  const PayloadLayout layout =
      dynamic_cast<DecoupledMomentum&>(*peer.learner.strategy).payload_layout();
  // The witness check decodes every fetched payload; apply() takes the result from this store
  // instead of decoding it again. It is the peer's: every strategy the peer makes is handed it.
  peer.decoded = std::make_shared<DecodedPayloads>(layout, kDecodedPayloadBytes);
  share_decoded_payloads(peer);
  LinkSettings settings;
  settings.run_id = peer.run_id;
  settings.validator = [store = peer.decoded](std::string_view hash, std::string_view bytes,
                                              uint64_t step) -> std::optional<std::string> {
    try {
      const uint64_t payload_step = store->decode(hash, bytes, step);
      // A payload of another step (an old one replayed under a new commitment) has the right
      // layout: refused here, it never becomes final and its author is struck.
      if (payload_step != step) {
        return fmt::format("the payload is for step {}, its commitment for step {}", payload_step,
                           step);
      }
      return std::nullopt;
    } catch (const Error& e) {
      return e.what();
    }
  };
  settings.witness_seconds = config.network.witness_seconds;
  settings.max_payload_bytes = encoded_size(layout);
  for (const auto& item : peer.learner.model->named_parameters()) {
    // Snapshots serve parameters as F32 (model_state.cc).
    const auto bytes = static_cast<uint64_t>(item.value().numel()) * sizeof(float);
    settings.max_tensor_bytes = std::max(settings.max_tensor_bytes, bytes);
    settings.tensor_bytes[item.key()] = bytes;
  }
  peer.link.configure(std::move(settings));
}

}  // namespace agora::peer
