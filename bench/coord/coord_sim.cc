// agora_coord_sim: the real coordinator state machine (coord/state_machine.h) driven by N
// simulated members on an event clock, for member counts one machine cannot host as processes
// (issue 41, docs/scaling.md).
//
// What is real: every message the members send is a real wire message (Joins, Heartbeats every
// second, Commits signed by the member's own key, Witnesses listing every committed hash), and
// the coordinator is the real StateMachine with the service's batching (at most 512 messages a
// batch, then the tick, then coalesce_admits). Its CPU time is measured, not modelled: the clock
// of the simulation advances by the measured time of each handle() and tick() call.
//
// What is modelled:
//   - the service around the state machine: each message it receives or sends costs
//     --us-per-message of CPU (decryption, routing, its share of the batch's SQLite save), and
//     each byte it sends --send-ns-per-byte (the CURVE encryption, copies and syscalls;
//     both calibrated against the load test,
//     docs/scaling.md) and leaves over the coordinator's uplink (--coordinator-link), one
//     message after another; a RoundStart sent again while the last one to that member has
//     not left the uplink yet is held back, as the service holds it while it waits in
//     ZeroMQ's queue (--send-queued-round-starts: as before the service did);
//   - every member's link (--member-link): its messages take the one-way delay, and a member's
//     witness fetch takes (commits - 1) x --payload-bytes over its bandwidth plus a round trip;
//   - training: a share of S sequences takes S / --speed seconds;
//   - SQLite's bytes are not modelled (measured apart by the load test: about 10 MB a round at
//     1000), only its CPU, within --us-per-message.
//
// Per N, one JSON line and a table row: join seconds, round seconds (first RoundStart out to
// the last Finalized in, median over rounds after the first), the coordinator's busy share,
// state-machine CPU seconds per round, messages and bytes the coordinator sends per round, and
// what each member downloads per round.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "agora/coord/admit_batch.h"
#include "agora/coord/state_machine.h"
#include "agora/core/hash.h"
#include "agora/core/list_bits.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"
#include "agora/net/link_profile.h"

namespace {

using agora::coord::Actions;
using agora::coord::Outgoing;
using agora::coord::StateMachine;
using agora::net::Identity;
using agora::net::PublicKey;
namespace wire = agora::wire;

struct Settings {
  int rounds = 8;
  double speed = 8.0;
  double payload_bytes = 2338;
  double send_ns_per_byte = 2.5;
  double us_per_message = 50;
  bool hold_queued_round_starts = true;  // as the service does (coord/outbox.h)
  agora::net::LinkProfile coordinator_link;
  agora::net::LinkProfile member_link;
};

double cpu_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double transfer_seconds(double bytes, const agora::net::LinkProfile& link) {
  return link.bandwidth_bits_per_second > 0 ? bytes * 8.0 / link.bandwidth_bits_per_second : 0.0;
}

struct Event {
  double at = 0;
  uint64_t seq = 0;
  enum Kind { kToCoordinator, kToMember, kHeartbeat, kTrainDone, kFetchDone } kind = kToCoordinator;
  size_t member = 0;
  // Shared: the queue moves events around, and a Collect at 3000 members is megabytes. To a
  // member, `shared` is what the coordinator built once for many (Outgoing), and `message`
  // this member's own part.
  std::shared_ptr<const wire::Envelope> message;
  std::shared_ptr<const wire::Envelope> shared;
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

struct SimMember {
  Identity identity;
  bool welcomed = false;
  uint64_t applied = 0, next_round = 0, trained = UINT64_MAX, witnessed = UINT64_MAX;
  double link_free_at = 0;  // its downlink: messages and payloads arrive one after another
  // When the last message to it leaves the coordinator's uplink, and the step of the last
  // RoundStart sent to it: the service holds back another while that one is still queued.
  double queued_until = 0;
  uint64_t round_start_step = UINT64_MAX;
};

class Simulation {
 public:
  Simulation(size_t n, const Settings& s) : settings_(s) {
    agora::coord::Options options;
    options.run_id = "sim";
    options.total_steps = static_cast<uint64_t>(s.rounds);
    options.batch_size = 4 * n;
    options.network.min_peers = static_cast<int64_t>(n);
    options.network.max_members = static_cast<int64_t>(n);
    options.network.warmup_seconds = 2.0;
    options.network.overlap = 1;
    options.network.min_deadline_seconds = 600;
    options.network.witness_seconds = 600;
    options.network.heartbeat_timeout_seconds = 600;
    options.network.checkpointers = 0;
    options.verify.rate = 0;
    machine_ = std::make_unique<StateMachine>(options, agora::coord::RunState{});
    for (size_t i = 0; i < n; ++i) {
      members_.push_back({Identity::from_seed(agora::blake2b256_bytes(fmt::format("sim-{}", i)))});
      index_[members_.back().identity.public_key()] = i;
      wire::Envelope join;
      join.mutable_join()->set_key(members_[i].identity.public_key());
      join.mutable_join()->set_endpoint(
          fmt::format("tcp://10.{}.{}.{}:7500", i >> 16, (i >> 8) & 255, i & 255));
      join.mutable_join()->set_agent("agora sim member");
      join.mutable_join()->set_sequences_per_second(s.speed);
      // Volunteers arrive over the first second.
      push(static_cast<double>(i) / static_cast<double>(n), Event::kToCoordinator, i, join);
      push(1.0 + static_cast<double>(i) / static_cast<double>(n), Event::kHeartbeat, i, {});
    }
  }

  nlohmann::json run() {
    double next_tick = 0;
    constexpr double kNever = 1e300;
    // Bounded in simulated time: a run that cannot finish (it never should) still ends.
    while (!finished_ && now_ < 36000) {
      // Three things can happen next: an event (a member's, or a message reaching the
      // coordinator's inbox), the tick (every 0.1 s, when the coordinator is free), or a batch
      // (up to 512 messages of the inbox, when it is free). Events go first on a tie, so that
      // what arrives at a batch's instant is in it.
      const double event_at = queue_.empty() ? kNever : queue_.top().at;
      const double tick_at = std::max(next_tick, busy_until_);
      const double batch_at = inbox_.empty() ? kNever : std::max(busy_until_, inbox_.front().at);
      if (event_at == kNever && batch_at == kNever) break;
      if (event_at <= tick_at && event_at <= batch_at) {
        Event e = queue_.top();
        queue_.pop();
        now_ = e.at;
        if (e.kind == Event::kToCoordinator) {
          inbox_.push_back(std::move(e));
        } else {
          on_member(e);
        }
      } else if (tick_at <= batch_at) {
        tick(tick_at);
        next_tick = tick_at + 0.1;
      } else {
        now_ = batch_at;
        while (!inbox_.empty() && inbox_.front().at <= now_ && batch_.size() < 512) {
          batch_.push_back(std::move(inbox_.front()));
          inbox_.pop_front();
        }
        handle_batch();
      }
    }
    std::vector<double> rounds;
    for (const auto& [step, t] : steps_) {
      if (step > 0 && t.final_last > 0 && t.round_first > 0)
        rounds.push_back(t.final_last - t.round_first);
    }
    std::sort(rounds.begin(), rounds.end());
    const double round_s = rounds.empty() ? -1 : rounds[rounds.size() / 2];
    const double span = last_final_ - first_round_;
    const double per_round = static_cast<double>(std::max<size_t>(1, steps_.size()));
    return {{"members", members_.size()},
            {"steps", finalized_},
            {"join_seconds", first_round_},
            {"round_seconds", round_s},
            {"coordinator_busy_share", span > 0 ? round_busy_ / span : 0.0},
            // From the first RoundStart to the last Finalized, over the steps: with overlap, a
            // step's fetches run beside the next step's training, so this is the run's pace.
            {"seconds_per_step", finalized_ > 0 ? span / static_cast<double>(finalized_) : -1.0},
            {"machine_cpu_seconds_per_round", round_cpu_ / per_round},
            // The state machine's and the modelled service's: the load test's "coordinator CPU".
            {"coordinator_cpu_seconds_per_round", (round_cpu_ + round_service_cpu_) / per_round},
            {"messages_per_round", static_cast<double>(round_messages_) / per_round},
            {"round_starts_held_per_round", static_cast<double>(round_starts_held_) / per_round},
            {"coordinator_bytes_per_round", round_bytes_ / per_round},
            {"coordinator_bytes_per_round_by_kind", by_kind(per_round)},
            {"member_download_per_round",
             settings_.payload_bytes * static_cast<double>(members_.size() - 1)}};
  }

 private:
  struct StepTimes {
    double round_first = 0, final_last = 0;
  };

  void push(double at, Event::Kind kind, size_t member, wire::Envelope message,
            std::shared_ptr<const wire::Envelope> shared = nullptr) {
    queue_.push({at, seq_++, kind, member,
                 std::make_shared<const wire::Envelope>(std::move(message)), std::move(shared)});
  }

  void tick(double at) {
    now_ = at;
    const double started = cpu_now();
    Actions a = machine_->tick(at);
    finish_call(at, started, std::move(a));
  }

  void handle_batch() {
    const double start = now_;
    const double started = cpu_now();
    Actions all;
    for (Event& e : batch_) {
      const PublicKey& key = members_[e.member].identity.public_key();
      Actions a = machine_->handle(key, *e.message, start);
      for (auto& o : a.send) all.send.push_back(std::move(o));
    }
    const double received = static_cast<double>(batch_.size());
    batch_.clear();
    finish_call(start, started, std::move(all), received);
  }

  // Charges the measured CPU and the sends, and puts every message on its way.
  void finish_call(double at, double cpu_started, Actions a, double received = 0) {
    agora::coord::coalesce_admits(a.send);
    // The state machine's measured time, and the service's per message it received.
    const double machine = cpu_now() - cpu_started;
    const double receiving = received * settings_.us_per_message * 1e-6;
    double done = at + machine + receiving;
    const bool in_rounds = first_round_ > 0;
    if (in_rounds) round_cpu_ += machine;
    double busy = machine + receiving;
    std::map<const wire::Envelope*, double> shared_bytes;  // sized once, as the service encodes
    for (Outgoing& o : a.send) {
      auto it = index_.find(o.to);
      SimMember* m = it == index_.end() ? nullptr : &members_[it->second];
      if (m != nullptr && o.body_case() == wire::Envelope::kRoundStart) {
        const uint64_t step = (o.shared ? *o.shared : o.message).round_start().step();
        if (settings_.hold_queued_round_starts && m->round_start_step == step &&
            m->queued_until > done) {
          if (in_rounds) ++round_starts_held_;
          continue;
        }
        m->round_start_step = step;
      }
      double bytes = static_cast<double>(o.message.ByteSizeLong());
      if (o.shared) {
        auto [it, fresh] = shared_bytes.emplace(o.shared.get(), 0.0);
        if (fresh) it->second = static_cast<double>(o.shared->ByteSizeLong());
        bytes += it->second;
      }
      const double send_cpu =
          settings_.us_per_message * 1e-6 + bytes * settings_.send_ns_per_byte * 1e-9;
      done += send_cpu;
      busy += send_cpu;
      uplink_free_at_ =
          std::max(uplink_free_at_, done) + transfer_seconds(bytes, settings_.coordinator_link);
      if (in_rounds) {
        ++round_messages_;
        round_bytes_ += bytes;
        kind_bytes_[kind_of(o)] += bytes;
      }
      if (m == nullptr) continue;
      m->queued_until = uplink_free_at_;
      const double arrives = std::max(uplink_free_at_ + settings_.coordinator_link.delay_seconds +
                                          settings_.member_link.delay_seconds,
                                      m->link_free_at) +
                             transfer_seconds(bytes, settings_.member_link);
      m->link_free_at = arrives;
      push(arrives, Event::kToMember, it->second, std::move(o.message), std::move(o.shared));
    }
    if (in_rounds) round_busy_ += busy;
    if (in_rounds) round_service_cpu_ += busy - machine;
    busy_until_ = done;
  }

  void to_coordinator(size_t i, double at, wire::Envelope message) {
    const double bytes = static_cast<double>(message.ByteSizeLong());
    push(at + settings_.member_link.delay_seconds + settings_.coordinator_link.delay_seconds +
             transfer_seconds(bytes, settings_.member_link),
         Event::kToCoordinator, i, std::move(message));
  }

  void on_member(const Event& e) {
    SimMember& m = members_[e.member];
    // The kind and the common fields; a RoundStart's assignment is in the member's own part.
    const wire::Envelope& msg = e.shared ? *e.shared : *e.message;
    if (e.kind == Event::kHeartbeat) {
      if (finished_) return;
      if (m.welcomed) {
        wire::Envelope hb;
        hb.mutable_heartbeat()->set_applied_steps(m.applied);
        hb.mutable_heartbeat()->set_next_round(m.next_round);
        to_coordinator(e.member, e.at, hb);
      }
      push(e.at + 1.0, Event::kHeartbeat, e.member, {});
    } else if (e.kind == Event::kTrainDone) {
      to_coordinator(e.member, e.at, msg);
    } else if (e.kind == Event::kFetchDone) {
      to_coordinator(e.member, e.at, msg);
    } else if (msg.has_welcome()) {
      m.welcomed = true;
      m.applied = std::max(m.applied, msg.welcome().finalized_steps());
    } else if (msg.has_round_start()) {
      const auto& r = msg.round_start();
      StepTimes& t = steps_[r.step()];
      if (t.round_first == 0 || e.at < t.round_first) t.round_first = e.at;
      if (first_round_ == 0) first_round_ = e.at;
      m.next_round = std::max(m.next_round, r.step() + 1);
      uint64_t sequences = 0;
      for (const auto& range : r.assignment()) sequences += range.count();
      if (e.shared) {
        for (const auto& range : e.message->round_start().assignment()) sequences += range.count();
      }
      if (sequences == 0 || m.trained == r.step()) return;
      m.trained = r.step();
      const std::string hash = agora::blake2b256_bytes(fmt::format("{}-{}", e.member, r.step()));
      wire::Envelope commit;
      auto* c = commit.mutable_commit();
      c->mutable_record()->set_author(m.identity.public_key());
      c->mutable_record()->set_step(r.step());
      c->mutable_record()->set_payload_hash(hash);
      c->mutable_record()->set_signature(
          m.identity.sign(agora::net::commit_signing_bytes("sim", r.step(), hash)));
      c->set_sequences(sequences);
      const double seconds = static_cast<double>(sequences) / settings_.speed;
      c->set_compute_seconds(seconds);
      c->set_payload_bytes(static_cast<uint64_t>(settings_.payload_bytes));
      push(e.at + seconds, Event::kTrainDone, e.member, commit);
    } else if (msg.has_collect()) {
      const auto& c = msg.collect();
      if (m.witnessed == c.step()) return;
      m.witnessed = c.step();
      wire::Envelope w;
      w.mutable_witness()->set_step(c.step());
      std::string held = agora::list_bits(c.commits_size());
      for (int i = 0; i < c.commits_size(); ++i) agora::set_list_bit(held, i);
      w.mutable_witness()->set_of_collect(std::move(held));
      const double payloads = static_cast<double>(std::max(0, c.commits_size() - 1));
      const double fetch =
          transfer_seconds(payloads * settings_.payload_bytes, settings_.member_link) +
          2 * settings_.member_link.delay_seconds;
      push(e.at + fetch, Event::kFetchDone, e.member, w);
    } else if (msg.has_finalized()) {
      const uint64_t step = msg.finalized().step();
      m.applied = std::max(m.applied, step + 1);
      StepTimes& t = steps_[step];
      t.final_last = std::max(t.final_last, e.at);
      last_final_ = std::max(last_final_, e.at);
      if (step + 1 > finalized_) finalized_ = step + 1;
    } else if (msg.has_finished()) {
      finished_ = true;
    }
  }

  Settings settings_;
  std::unique_ptr<StateMachine> machine_;
  std::vector<SimMember> members_;
  std::map<PublicKey, size_t> index_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  std::deque<Event> inbox_;  // arrived at the coordinator, not yet handled, in arrival order
  std::vector<Event> batch_;
  uint64_t seq_ = 0;
  double now_ = 0, busy_until_ = 0, uplink_free_at_ = 0;
  double first_round_ = 0, last_final_ = 0, round_cpu_ = 0, round_busy_ = 0, round_bytes_ = 0;
  double round_service_cpu_ = 0;  // modelled: per message and per byte
  uint64_t round_messages_ = 0, finalized_ = 0, round_starts_held_ = 0;
  // Bytes sent in the rounds by kind; a RoundStart to a member that had one for that step
  // already is a heal ("round_start_again").
  std::map<std::string, double> kind_bytes_;
  std::set<std::pair<uint64_t, PublicKey>> round_start_sent_;

  std::string kind_of(const Outgoing& o) {
    const wire::Envelope& body = o.shared ? *o.shared : o.message;
    if (!body.has_round_start()) return agora::net::kind_name(body);
    const bool again = !round_start_sent_.emplace(body.round_start().step(), o.to).second;
    return again ? "round_start_again" : "round_start";
  }
  nlohmann::json by_kind(double per_round) const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [kind, bytes] : kind_bytes_) out[kind] = bytes / per_round;
    return out;
  }
  bool finished_ = false;
  std::map<uint64_t, StepTimes> steps_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agora_coord_sim: the coordinator state machine under N simulated members"};
  std::string members = "10,100,300,1000,3000,10000";
  std::string coordinator_link = "rate=1gbit,delay=5ms", member_link = "rate=100mbit,delay=25ms";
  std::string json_out;
  Settings s;
  app.add_option("--members", members, "member counts, comma-separated");
  app.add_option("--rounds", s.rounds, "steps of the run")->check(CLI::Range(2, 1000));
  app.add_option("--speed", s.speed, "sequences per second each member trains");
  app.add_option("--payload-bytes", s.payload_bytes, "one payload's size");
  bool send_queued = false;
  app.add_flag("--send-queued-round-starts", send_queued,
               "send every RoundStart the state machine heals, even while the last one to that "
               "member is still queued (the service before it held them back)");
  app.add_option("--us-per-message", s.us_per_message,
                 "the coordinator's CPU per message it receives or sends, beside the state "
                 "machine's (decryption, routing, the batch's SQLite save)");
  app.add_option("--send-ns-per-byte", s.send_ns_per_byte,
                 "the coordinator's CPU per byte it sends (CURVE, copies, syscalls)");
  app.add_option("--coordinator-link", coordinator_link, "the coordinator's link (agora link)");
  app.add_option("--member-link", member_link, "every member's link (agora link)");
  app.add_option("--json", json_out, "write the results here (JSON)");
  CLI11_PARSE(app, argc, argv);
  s.hold_queued_round_starts = !send_queued;
  try {
    s.coordinator_link = agora::net::parse_link_profile(coordinator_link);
    s.member_link = agora::net::parse_link_profile(member_link);
    nlohmann::json results = nlohmann::json::array();
    std::string by_kind_lines;  // printed after the table
    fmt::print(
        "| N | steps | join s | round s | s/step | coordinator busy | machine CPU s/round | "
        "coordinator CPU s/round | msgs sent/round | coordinator MB/round | member MB/round "
        "|\n");
    fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& part : CLI::detail::split(members, ',')) {
      const size_t n = std::stoul(part);
      Simulation sim(n, s);
      const nlohmann::json r = sim.run();
      results.push_back(r);
      fmt::print("| {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.2f} | {:.3f} | {:.3f} | {:.0f} | {:.1f} | {:.2f} |\n", n,
                 r["steps"].get<uint64_t>(), r["join_seconds"].get<double>(),
                 r["round_seconds"].get<double>(), r["seconds_per_step"].get<double>(),
                 r["coordinator_busy_share"].get<double>(),
                 r["machine_cpu_seconds_per_round"].get<double>(),
                 r["coordinator_cpu_seconds_per_round"].get<double>(),
                 r["messages_per_round"].get<double>(),
                 r["coordinator_bytes_per_round"].get<double>() / 1e6,
                 r["member_download_per_round"].get<double>() / 1e6);
      for (const auto& [kind, bytes] : r["coordinator_bytes_per_round_by_kind"].items()) {
        by_kind_lines += fmt::format("{}N={} {}: {:.1f} MB/round", by_kind_lines.empty() ? "" : "\n", n, kind, bytes.get<double>() / 1e6);
      }
      std::fflush(stdout);
    }
    fmt::print("\nWhat the coordinator sends, by kind:\n{}\n", by_kind_lines);
    if (!json_out.empty()) {
      std::FILE* f = std::fopen(json_out.c_str(), "w");
      if (f == nullptr) throw std::runtime_error("cannot write " + json_out);
      std::fputs(nlohmann::json{{"results", results}}.dump(1).c_str(), f);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "agora_coord_sim: {}\n", e.what());
    return 1;
  }
  return 0;
}
