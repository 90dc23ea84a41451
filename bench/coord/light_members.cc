// agora_light_members: many members of a data-parallel run in one process, without a model, for
// loading a real coordinator (bench/coord/bench_coordinator_load.py, docs/scaling.md).
//
// Each light member does what the coordinator sees of a real member: it joins with its own key
// over its own CURVE connection, heartbeats every second, commits a payload signed by its key
// for every share it is assigned (after share / --sequences-per-second seconds, as if it
// trained), witnesses every
// Collect and follows Finalized. Its payloads are valid DeMo payloads of the run's exact layout
// (built from the run config the Welcome carries, torch-free), different for every member and
// step, served by a CURVE server under the member's own key: a real `agora peer` in the run
// fetches, checks and applies them like any other.
//
// What it does not do, and says so in its report: it fetches --fetch payloads per round from the
// members after it in the Collect's order (a real member fetches every one; at N members one
// machine cannot host N^2 fetches a round), yet witnesses holding every committed payload, as a
// real member does once its fetches end; it never sends a StateReport (it holds no parameters,
// and a made-up hash would outvote the real peers' hashes). The real peers in the run measure
// what a member's download really is.
//
// Output: --out FILE, one JSON object at exit (SIGTERM, SIGINT, --seconds, or every member
// released): per member the join time and what it sent, fetched and was refused; per step the
// times members received RoundStart, Collect and Finalized; per message kind the count and bytes
// each way. Exits 0 after writing it.
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "agora/config/parameter_shapes.h"
#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/core/list_bits.h"
#include "agora/net/curve_socket.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"
#include "agora/optim/chunking.h"
#include "agora/optim/payload.h"
#include "agora/serve/poll.h"

namespace {

using agora::net::Identity;
using agora::net::PublicKey;
using json = nlohmann::json;

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop = true;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A payload of the run's layout whose every position and value follow from (member, step), so
// no two members or steps share a hash.
std::string make_payload(const agora::PayloadLayout& layout, uint64_t member_seed, uint64_t step) {
  std::mt19937_64 rng(member_seed * 1000003u + step);
  agora::Payload p;
  p.kind = layout.kind;
  p.step = step;
  for (const agora::TensorLayout& t : layout.tensors) {
    agora::TensorPayload tp;
    tp.layout = t;
    const int64_t chunks = t.num_chunks();
    tp.positions.reserve(static_cast<size_t>(chunks * t.topk));
    tp.values.reserve(static_cast<size_t>(chunks * t.topk));
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t room = t.chunk_size() - t.topk + 1;
      const auto first = static_cast<uint32_t>(rng() % static_cast<uint64_t>(room));
      for (int64_t i = 0; i < t.topk; ++i) {
        tp.positions.push_back(first + static_cast<uint32_t>(i));
        const bool negative = (rng() & 1) != 0;
        tp.values.push_back(t.value_type == agora::ValueType::kOneBit
                                ? (negative ? -1.0f : 1.0f)
                                : (negative ? -1e-3f : 1e-3f));
      }
    }
    p.tensors.push_back(std::move(tp));
  }
  return agora::encode_payload(p);
}

struct KindCount {
  uint64_t count = 0, bytes = 0;
};

struct StepTimes {
  double round_first = 0, round_last = 0, collect_first = 0, collect_last = 0, final_first = 0,
         final_last = 0;
  uint64_t rounds = 0, collects = 0, finals = 0, commits = 0, commit_listed = 0;
  static void mark(double t, double& first, double& last, uint64_t& n) {
    if (n == 0 || t < first) first = t;
    if (n == 0 || t > last) last = t;
    ++n;
  }
};

struct Member {
  explicit Member(Identity id) : identity(std::move(id)) {}
  size_t index = 0;
  Identity identity;
  std::unique_ptr<agora::net::Client> coordinator;
  std::unique_ptr<agora::net::Server> server;
  std::string endpoint;
  bool welcomed = false, done = false;
  std::string refused;  // the refusal that ended it
  double join_sent = 0, welcome_at = 0, next_heartbeat = 0, next_join = 0;
  uint64_t applied = 0, next_round = 0;
  std::map<uint64_t, std::string> blobs;  // hash -> payload, of the newest steps
  std::map<std::string, std::string> by_hash;
  // A share to commit once "trained": (when, step, sequences).
  std::optional<std::tuple<double, uint64_t, uint64_t>> training;
  uint64_t last_trained = UINT64_MAX;
  // A Collect being fetched for: its step, hashes, and what is still asked.
  std::optional<agora::wire::Collect> collecting;
  std::map<std::string, double> asked;  // hash -> when
  uint64_t last_witnessed = UINT64_MAX;
  // Connections to other members' servers, by their key (at most kMaxLinks, oldest first out).
  std::map<PublicKey, std::unique_ptr<agora::net::Client>> links;
  std::vector<PublicKey> link_order;
  // Counts.
  uint64_t commits = 0, witnesses = 0, heartbeats = 0, joins = 0, fetched = 0, fetched_bytes = 0,
           served = 0, served_bytes = 0, fetch_timeouts = 0;
  std::map<std::string, uint64_t> refusals;
};

constexpr size_t kMaxLinks = 16;
constexpr size_t kKeepSteps = 8;
constexpr double kFetchTimeout = 10.0;

class LightMembers {
 public:
  struct Options {
    std::string coordinator;
    PublicKey coordinator_key;
    std::string host = "127.0.0.1";
    int first_port = 0;
    size_t members = 100;
    size_t first_index = 0;
    std::string seed = "light";
    double sequences_per_second = 8.0;
    size_t fetch = 1;
    double seconds = 600;
  };

  explicit LightMembers(Options options) : options_(std::move(options)) {
    for (size_t i = 0; i < options_.members; ++i) {
      const size_t index = options_.first_index + i;
      auto m = std::make_unique<Member>(
          Identity::from_seed(agora::blake2b256_bytes(fmt::format("{}-{}", options_.seed, index))));
      m->index = index;
      m->endpoint =
          fmt::format("tcp://{}:{}", options_.host, options_.first_port + static_cast<int>(i));
      m->server = std::make_unique<agora::net::Server>(context_, m->identity, m->endpoint,
                                                       agora::net::DecodeLimits{});
      m->coordinator = std::make_unique<agora::net::Client>(
          context_, m->identity, options_.coordinator, options_.coordinator_key,
          agora::net::DecodeLimits{});
      // Staggered joins, as volunteers arrive: 2 ms apart within a process.
      m->next_join = now_seconds() + 0.002 * static_cast<double>(i);
      members_.push_back(std::move(m));
    }
  }

  void run() {
    const double end = now_seconds() + options_.seconds;
    std::vector<zmq::pollitem_t> items;
    while (!g_stop && now_seconds() < end) {
      items.clear();
      for (auto& m : members_) {
        items.push_back({m->coordinator->socket().handle(), 0, ZMQ_POLLIN, 0});
        items.push_back({m->server->socket().handle(), 0, ZMQ_POLLIN, 0});
      }
      agora::serve::poll(items, std::chrono::milliseconds(20));  // a signal ends it early
      const double now = now_seconds();
      bool all_done = true;
      for (size_t i = 0; i < members_.size(); ++i) {
        Member& m = *members_[i];
        if (items[2 * i].revents & ZMQ_POLLIN) drain_coordinator(m, now);
        if (items[2 * i + 1].revents & ZMQ_POLLIN) serve(m);
        drain_links(m);
        if (!m.done) timers(m, now);
        all_done = all_done && m.done;
      }
      if (all_done) break;
    }
  }

  json report() const {
    json members = json::array();
    for (const auto& p : members_) {
      const Member& m = *p;
      members.push_back({{"index", m.index},
                         {"key", agora::hex_encode(m.identity.public_key())},
                         {"welcomed", m.welcomed},
                         {"join_seconds", m.welcomed ? m.welcome_at - m.join_sent : -1.0},
                         {"joins", m.joins},
                         {"commits", m.commits},
                         {"witnesses", m.witnesses},
                         {"heartbeats", m.heartbeats},
                         {"fetched", m.fetched},
                         {"fetched_bytes", m.fetched_bytes},
                         {"fetch_timeouts", m.fetch_timeouts},
                         {"served", m.served},
                         {"served_bytes", m.served_bytes},
                         {"refusals", m.refusals},
                         {"refused", m.refused}});
    }
    json steps = json::object();
    for (const auto& [step, t] : steps_) {
      steps[std::to_string(step)] = {{"round_first", t.round_first},
                                     {"round_last", t.round_last},
                                     {"rounds", t.rounds},
                                     {"collect_first", t.collect_first},
                                     {"collect_last", t.collect_last},
                                     {"collects", t.collects},
                                     {"final_first", t.final_first},
                                     {"final_last", t.final_last},
                                     {"finals", t.finals},
                                     {"commits", t.commits},
                                     {"commit_listed", t.commit_listed}};
    }
    auto kinds = [](const std::map<std::string, KindCount>& m) {
      json j = json::object();
      for (const auto& [k, v] : m) j[k] = {{"count", v.count}, {"bytes", v.bytes}};
      return j;
    };
    return {{"members", members},
            {"steps", steps},
            {"to_coordinator", kinds(sent_)},
            {"from_coordinator", kinds(received_)},
            {"payload_bytes", payload_bytes_},
            {"fetch", options_.fetch},
            {"sequences_per_second", options_.sequences_per_second}};
  }

 private:
  void send(Member& m, const agora::wire::Envelope& e) {
    KindCount& k = sent_[agora::net::kind_name(e)];
    ++k.count;
    k.bytes += e.ByteSizeLong();
    m.coordinator->send(e);
  }

  void send_join(Member& m, double now) {
    agora::wire::Envelope e;
    auto* j = e.mutable_join();
    j->set_key(m.identity.public_key());
    j->set_endpoint(m.endpoint);
    j->set_agent("agora light member (bench/coord)");
    j->set_sequences_per_second(options_.sequences_per_second);
    j->set_applied_steps(m.applied);
    if (m.join_sent == 0) m.join_sent = now;
    ++m.joins;
    m.next_join = now + 5.0;  // again if unanswered, as agora peer does (peer/session.cc)
    send(m, e);
  }

  void timers(Member& m, double now) {
    if (!m.welcomed) {
      if (now >= m.next_join) send_join(m, now);
      return;
    }
    if (now >= m.next_heartbeat) {
      agora::wire::Envelope e;
      e.mutable_heartbeat()->set_applied_steps(m.applied);
      e.mutable_heartbeat()->set_next_round(m.next_round);
      send(m, e);
      ++m.heartbeats;
      m.next_heartbeat = now + 1.0;
    }
    if (m.training && now >= std::get<0>(*m.training)) {
      commit(m, std::get<1>(*m.training), std::get<2>(*m.training));
      m.training.reset();
    }
    if (m.collecting) {
      std::erase_if(m.asked, [&](const auto& a) {
        if (now - a.second < kFetchTimeout) return false;
        ++m.fetch_timeouts;
        return true;
      });
      if (m.asked.empty()) witness(m);
    }
  }

  void commit(Member& m, uint64_t step, uint64_t sequences) {
    if (!layout_) return;
    std::string bytes = make_payload(*layout_, m.index + 1, step);
    payload_bytes_ = bytes.size();
    const std::string hash = agora::blake2b256_bytes(bytes);
    m.by_hash[hash] = std::move(bytes);
    m.blobs[step] = hash;
    while (m.blobs.size() > kKeepSteps) {
      m.by_hash.erase(m.blobs.begin()->second);
      m.blobs.erase(m.blobs.begin());
    }
    agora::wire::Envelope e;
    auto* c = e.mutable_commit();
    c->mutable_record()->set_author(m.identity.public_key());
    c->mutable_record()->set_step(step);
    c->mutable_record()->set_payload_hash(hash);
    c->mutable_record()->set_signature(
        m.identity.sign(agora::net::commit_signing_bytes(run_id_, step, hash)));
    c->set_sequences(sequences);
    c->set_compute_seconds(static_cast<double>(sequences) / options_.sequences_per_second);
    c->set_loss(0.0);
    c->set_payload_bytes(payload_bytes_);
    c->set_trained_from(m.applied);
    send(m, e);
    ++m.commits;
    ++steps_[step].commits;
  }

  void witness(Member& m) {
    agora::wire::Envelope e;
    auto* w = e.mutable_witness();
    w->set_step(m.collecting->step());
    // Every commit held, as bits over the Collect (what a peer sends).
    std::string held = agora::list_bits(m.collecting->commits_size());
    for (int i = 0; i < m.collecting->commits_size(); ++i) agora::set_list_bit(held, i);
    w->set_of_collect(std::move(held));
    send(m, e);
    ++m.witnesses;
    m.last_witnessed = m.collecting->step();
    m.collecting.reset();
  }

  // The members after this one in the Collect's order, --fetch of them, are asked for their
  // payloads; the rest are taken as held.
  void start_fetches(Member& m, double now) {
    const auto& commits = m.collecting->commits();
    const auto& members = m.collecting->members();
    size_t self = 0;
    for (int i = 0; i < commits.size(); ++i) {
      if (commits[i].author() == m.identity.public_key()) self = static_cast<size_t>(i);
    }
    for (size_t k = 1; k <= options_.fetch && k < static_cast<size_t>(commits.size()); ++k) {
      const auto& c = commits[static_cast<int>((self + k) % static_cast<size_t>(commits.size()))];
      if (c.author() == m.identity.public_key()) continue;
      std::string endpoint;
      for (const auto& member : members) {
        if (member.key() == c.author()) endpoint = member.endpoint();
      }
      if (endpoint.empty()) continue;
      agora::net::Client& link = link_to(m, c.author(), endpoint);
      agora::wire::Envelope e;
      e.mutable_get_blob()->set_hash(c.payload_hash());
      link.send(e);
      m.asked[c.payload_hash()] = now;
    }
    if (m.asked.empty()) witness(m);
  }

  agora::net::Client& link_to(Member& m, const PublicKey& key, const std::string& endpoint) {
    auto it = m.links.find(key);
    if (it != m.links.end() && it->second->endpoint() == endpoint) return *it->second;
    if (it != m.links.end()) {
      std::erase(m.link_order, key);
      m.links.erase(it);
    }
    while (m.links.size() >= kMaxLinks) {
      m.links.erase(m.link_order.front());
      m.link_order.erase(m.link_order.begin());
    }
    auto client = std::make_unique<agora::net::Client>(context_, m.identity, endpoint, key,
                                                       agora::net::DecodeLimits{});
    agora::net::Client& out = *client;
    m.links[key] = std::move(client);
    m.link_order.push_back(key);
    return out;
  }

  void drain_links(Member& m) {
    for (auto& [key, link] : m.links) {
      while (auto e = link->recv()) {
        if (!e->has_blob()) continue;
        const std::string& hash = e->blob().hash();
        if (!m.asked.contains(hash) || agora::blake2b256_bytes(e->blob().data()) != hash) continue;
        m.asked.erase(hash);
        ++m.fetched;
        m.fetched_bytes += e->blob().data().size();
      }
    }
  }

  void serve(Member& m) {
    for (int n = 0; n < 64; ++n) {
      std::optional<agora::net::Incoming> in = m.server->recv();
      if (!in) return;
      agora::wire::Envelope reply;
      if (in->message.has_get_blob()) {
        const std::string& hash = in->message.get_blob().hash();
        auto it = m.by_hash.find(hash);
        if (it != m.by_hash.end()) {
          reply.mutable_blob()->set_hash(hash);
          reply.mutable_blob()->set_data(it->second);
          ++m.served;
          m.served_bytes += it->second.size();
        } else {
          reply.mutable_not_found()->set_what(hash);
        }
      } else if (in->message.has_get_tensor()) {
        reply.mutable_not_found()->set_what(in->message.get_tensor().name());
      } else {
        continue;
      }
      m.server->send(in->route, reply);
    }
  }

  void drain_coordinator(Member& m, double now) {
    for (int n = 0; n < 256; ++n) {
      std::optional<agora::wire::Envelope> e = m.coordinator->recv();
      if (!e) return;
      KindCount& k = received_[agora::net::kind_name(*e)];
      ++k.count;
      k.bytes += e->ByteSizeLong();
      handle(m, *e, now);
    }
  }

  void handle(Member& m, const agora::wire::Envelope& e, double now) {
    if (e.has_welcome()) {
      if (!m.welcomed) m.welcome_at = now;
      m.welcomed = true;
      m.next_heartbeat = now;
      // A joiner loads the newest state before it trains: a light member has none to load, so
      // it counts as holding the finalized steps at once.
      m.applied = std::max(m.applied, e.welcome().finalized_steps());
      m.next_round = std::max(m.next_round, m.applied);
      if (!layout_) learn_run(e.welcome());
    } else if (e.has_refused()) {
      m.refusals[e.refused().reason().substr(0, 60)]++;
      m.welcomed = false;
      if (e.refused().may_rejoin()) {
        m.next_join = now + 1.0;
      } else {
        m.done = true;
        m.refused = e.refused().reason();
      }
    } else if (e.has_round_start()) {
      const auto& r = e.round_start();
      StepTimes& t = steps_[r.step()];
      StepTimes::mark(now, t.round_first, t.round_last, t.rounds);
      m.next_round = std::max(m.next_round, r.step() + 1);
      uint64_t sequences = 0;
      for (const auto& range : r.assignment()) sequences += range.count();
      if (sequences > 0 && m.last_trained != r.step()) {
        m.last_trained = r.step();
        m.training =
            std::make_tuple(now + static_cast<double>(sequences) / options_.sequences_per_second,
                            r.step(), sequences);
      }
    } else if (e.has_collect()) {
      const auto& c = e.collect();
      if (m.last_witnessed == c.step() || (m.collecting && m.collecting->step() == c.step())) {
        return;
      }
      StepTimes& t = steps_[c.step()];
      StepTimes::mark(now, t.collect_first, t.collect_last, t.collects);
      t.commit_listed =
          std::max<uint64_t>(t.commit_listed, static_cast<uint64_t>(c.commits_size()));
      if (m.collecting) witness(m);  // a newer Collect: the older one is answered as it stands
      m.collecting = c;
      m.asked.clear();
      start_fetches(m, now);
    } else if (e.has_finalized()) {
      const uint64_t step = e.finalized().step();
      StepTimes& t = steps_[step];
      StepTimes::mark(now, t.final_first, t.final_last, t.finals);
      m.applied = std::max(m.applied, step + 1);
    } else if (e.has_finished()) {
      if (!e.finished().linger()) m.done = true;
    }
  }

  void learn_run(const agora::wire::Welcome& welcome) {
    run_id_ = welcome.run_id();
    const agora::RunConfig config =
        agora::RunConfig::parse(welcome.run_config_toml(), "the run config of the Welcome");
    if (config.model.vocab_size <= 0) {
      agora::fail(
          "the run config names no model.vocab_size: set it in the config the bench "
          "gives the coordinator");
    }
    agora::PayloadLayout layout;
    layout.kind = agora::PayloadKind::kDemo;
    for (const agora::ParameterShape& p : agora::parameter_shapes(config.model)) {
      layout.tensors.push_back(agora::demo_tensor_layout(p.shape, config.demo.chunk,
                                                         config.demo.topk, config.demo.one_bit));
    }
    layout_ = std::move(layout);
  }

  Options options_;
  agora::net::Context context_;
  std::vector<std::unique_ptr<Member>> members_;
  std::optional<agora::PayloadLayout> layout_;
  std::string run_id_;
  uint64_t payload_bytes_ = 0;
  std::map<uint64_t, StepTimes> steps_;
  std::map<std::string, KindCount> sent_, received_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agora_light_members: members of a run without a model, for load tests"};
  LightMembers::Options o;
  std::string coordinator_key_hex, out;
  app.add_option("--coordinator", o.coordinator, "the coordinator's tcp://HOST:PORT")->required();
  app.add_option("--coordinator-key", coordinator_key_hex, "its public key (hex)")->required();
  app.add_option("--members", o.members, "members this process runs")->check(CLI::Range(1, 400));
  app.add_option("--first-index", o.first_index, "index of the first (keys follow from it)");
  app.add_option("--first-port", o.first_port, "member i serves at this port + i")->required();
  app.add_option("--host", o.host, "the address members advertise and bind");
  app.add_option("--seed", o.seed, "keys are Identity::from_seed(SEED-INDEX)");
  app.add_option("--sequences-per-second", o.sequences_per_second,
                 "how fast members 'train': a share of S sequences is committed S / this seconds "
                 "after its RoundStart");
  app.add_option("--fetch", o.fetch, "payloads each member fetches per round")
      ->check(CLI::Range(0, 16));
  app.add_option("--seconds", o.seconds, "stop after this long");
  app.add_option("--out", out, "the report (JSON)")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    o.coordinator_key = agora::hex_decode(coordinator_key_hex, 32, "--coordinator-key");
    // Two sockets per member and a few links each: far past the 1024 descriptors of a shell.
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    LightMembers members(o);
    members.run();
    std::ofstream(out) << members.report().dump() << "\n";
  } catch (const std::exception& e) {
    fmt::print(stderr, "agora_light_members: {}\n", e.what());
    return 1;
  }
  return 0;
}
