#include "agora/coord/service.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "agora/coord/state_machine.h"
#include "agora/coord/store.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/progress.h"

namespace agora::coord {
namespace fs = std::filesystem;
namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What the commits of one step said, for its table row.
struct StepCommits {
  std::map<net::PublicKey, wire::Commit> by_author;
};

class Service {
 public:
  Service(const RunConfig& config, const net::Identity& identity, const ServiceOptions& options)
      : config_(config), identity_(identity), options_(options) {}

  uint64_t run(const std::atomic<bool>& stop);

 private:
  void deliver(Actions actions);
  void print_finalized(uint64_t step, double now);
  void refuse(const net::Incoming& in, const std::string& reason, bool may_rejoin = false);

  const RunConfig& config_;
  const net::Identity& identity_;
  ServiceOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StateMachine> machine_;
  std::unique_ptr<net::Context> context_;
  std::unique_ptr<net::Server> server_;
  std::map<std::string, net::PublicKey> key_of_curve_;
  std::map<net::PublicKey, std::string> route_of_;
  std::map<net::PublicKey, std::deque<wire::Envelope>> undelivered_;
  std::map<uint64_t, StepCommits> commits_;
  uint64_t printed_ = 0;
  uint64_t saved_steps_ = 0;  // finalized steps in the database
  double last_final_at_ = 0;
  bool header_printed_ = false;
};

void Service::refuse(const net::Incoming& in, const std::string& reason, bool may_rejoin) {
  wire::Envelope e;
  e.mutable_refused()->set_reason(reason);
  e.mutable_refused()->set_may_rejoin(may_rejoin);
  server_->send(in.route, e);
}

void Service::deliver(Actions actions) {
  const double now = wall_now();
  // Persist first: a peer must never hear of a state a crash could forget.
  const uint64_t final_steps = machine_->state().finalized_steps();
  store_->save(machine_->state(), /*allow_rollback=*/final_steps < saved_steps_);
  saved_steps_ = final_steps;
  printed_ = std::min(printed_, final_steps);
  for (const std::string& line : actions.log) {
    if (options_.json_lines) {
      std::printf("%s\n", nlohmann::json{{"event", "log"}, {"text", line}}.dump().c_str());
    } else {
      std::printf("coordinator: %s\n", line.c_str());
    }
  }
  while (printed_ < machine_->state().finalized_steps()) print_finalized(printed_++, now);
  std::fflush(stdout);
  for (Outgoing& out : actions.send) {
    const auto route = route_of_.find(out.to);
    if (route != route_of_.end()) {
      server_->send(route->second, out.message);
    } else {
      // Not connected since this process started (a resumed run): it goes out with the member's
      // first message. Only the newest few are kept; the protocol re-asks for anything older.
      auto& queue = undelivered_[out.to];
      queue.push_back(std::move(out.message));
      if (queue.size() > 16) queue.pop_front();
    }
  }
}

void Service::print_finalized(uint64_t step, double now) {
  const auto& set = machine_->state().finalized.at(step);
  const StepCommits& commits = commits_[step];
  double loss = 0, bytes = 0;
  uint64_t sequences = 0;
  int counted = 0;
  for (const CommitRecord& r : set) {
    const auto it = commits.by_author.find(r.author);
    if (it == commits.by_author.end()) continue;  // committed before a restart
    loss += it->second.loss();
    bytes += static_cast<double>(it->second.payload_bytes());
    sequences += it->second.sequences();
    ++counted;
  }
  if (counted > 0) loss /= counted, bytes /= counted;
  const double seconds = last_final_at_ > 0 ? now - last_final_at_ : 0;
  last_final_at_ = now;
  const double tokens_per_second =
      seconds > 0 ? static_cast<double>(sequences * config_.data.seq_len) / seconds : 0;
  const int64_t parameters = config_.model.vocab_size > 0 ? config_.model.num_parameters() : 0;
  const double allreduce = 4.0 * static_cast<double>(parameters);
  if (options_.json_lines) {
    nlohmann::json authors = nlohmann::json::array();
    for (const CommitRecord& r : set) authors.push_back(net::short_key(r.author));
    const nlohmann::json row = {{"event", "step"},
                                {"time", now},
                                {"authors", authors},
                                {"step", step},
                                {"loss", counted > 0 ? loss : NAN},
                                {"peers", set.size()},
                                {"sequences", sequences},
                                {"tokens_per_second", tokens_per_second},
                                {"payload_bytes", bytes},
                                {"allreduce_bytes", allreduce}};
    std::printf("%s\n", row.dump().c_str());
  } else {
    if (!header_printed_) {
      std::printf("%8s  %8s  %5s  %10s  %12s  %14s\n", "step", "loss", "peers", "tokens/s",
                  "bytes/peer", "all-reduce");
      header_printed_ = true;
    }
    std::printf("%8llu  %8.4f  %5zu  %10.0f  %12s  %14s\n", static_cast<unsigned long long>(step),
                counted > 0 ? loss : NAN, set.size(), tokens_per_second,
                format_bytes(bytes).c_str(),
                parameters > 0 ? format_bytes(allreduce).c_str() : "?");
  }
  commits_.erase(commits_.begin(), commits_.upper_bound(step));
}

uint64_t Service::run(const std::atomic<bool>& stop) {
  const NetworkConfig& n = config_.network;
  check_decentralized(config_);
  const auto resolve = [&](const std::string& p) {
    return fs::path(p).is_absolute() ? fs::path(p) : options_.base_dir / p;
  };
  std::set<net::PublicKey> allowlist;
  if (!n.allowlist.empty()) allowlist = read_allowlist(resolve(n.allowlist));
  net::Admission admission;
  admission.open = allowlist.empty();
  for (const auto& key : allowlist) admission.curve_keys.insert(net::curve_public_of(key));

  store_ = std::make_unique<Store>(Store::open(resolve(n.state_db)));
  const std::string toml = config_.to_toml();
  std::string run_id;
  RunState state;
  bool resumed = false;
  if (auto run = store_->run()) {
    if (run->run_config_toml != toml) {
      fail(
          "{} belongs to run {}, started with a different run config; restart with that config "
          "(the database holds it) or set network.state_db to a new file for a new run",
          store_->path().string(), run->run_id);
    }
    run_id = run->run_id;
    if (auto loaded = store_->load()) {
      state = std::move(*loaded);
      resumed = true;
    }
  } else {
    run_id = net::key_to_hex(net::Identity::generate().public_key()).substr(0, 16);
    store_->bind(run_id, toml);
  }
  Options options{run_id,
                  toml,
                  static_cast<uint64_t>(config_.train.steps),
                  static_cast<uint64_t>(config_.train.batch_size),
                  n,
                  allowlist};
  options.tst_switch_step = static_cast<uint64_t>(config_.tst_switch_step());
  machine_ = std::make_unique<StateMachine>(options, std::move(state));
  printed_ = saved_steps_ = machine_->state().finalized_steps();
  // Members of a resumed run reconnect without joining again: their transport keys follow from
  // the ed25519 keys on record.
  for (const auto& [key, member] : machine_->state().members) {
    key_of_curve_[net::curve_public_of(key)] = key;
  }

  context_ = std::make_unique<net::Context>(admission);
  const net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};
  server_ = std::make_unique<net::Server>(*context_, identity_, n.listen, control);
  std::fprintf(stderr, "coordinator %s: run %s %s on %s (%s); state in %s\n",
               net::key_to_hex(identity_.public_key()).c_str(), run_id.c_str(),
               resumed
                   ? fmt::format("resumed at step {}", machine_->state().finalized_steps()).c_str()
                   : "started",
               server_->bound_endpoint().c_str(),
               allowlist.empty() ? "open to any key"
                                 : fmt::format("{} allowed keys", allowlist.size()).c_str(),
               store_->path().string().c_str());
  if (resumed) deliver(machine_->resume(wall_now()));

  double finished_at = 0, next_tick = 0;
  uint64_t dropped_seen = 0, refused_seen = 0;
  while (!stop.load()) {
    zmq::pollitem_t item{server_->socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    while (auto in = server_->recv()) {
      const wire::Envelope& m = in->message;
      if (m.has_join()) {
        std::string curve;
        try {
          curve = net::curve_public_of(m.join().key());
        } catch (const Error&) {
        }
        if (curve != in->curve_key) {
          refuse(*in, "the join names a key that is not the one this connection authenticated");
          continue;
        }
        key_of_curve_[in->curve_key] = m.join().key();
      }
      const auto key = key_of_curve_.find(in->curve_key);
      if (key == key_of_curve_.end()) {
        refuse(*in, "join first (this connection has not sent a Join)", /*may_rejoin=*/true);
        continue;
      }
      route_of_[key->second] = in->route;
      if (auto pending = undelivered_.find(key->second); pending != undelivered_.end()) {
        for (const auto& message : pending->second) server_->send(in->route, message);
        undelivered_.erase(pending);
      }
      if (m.has_commit()) commits_[m.commit().record().step()].by_author[key->second] = m.commit();
      deliver(machine_->handle(key->second, m, wall_now()));
    }
    if (server_->dropped() > dropped_seen) {
      dropped_seen = server_->dropped();
      std::fprintf(stderr, "coordinator: dropped a malformed message (%s); %llu so far\n",
                   server_->last_drop_reason().c_str(),
                   static_cast<unsigned long long>(dropped_seen));
    }
    if (context_->refused() > refused_seen) {
      refused_seen = context_->refused();
      std::fprintf(stderr,
                   "coordinator: refused a connection whose key is not on the allowlist; %llu "
                   "so far\n",
                   static_cast<unsigned long long>(refused_seen));
    }
    const double now = wall_now();
    if (now >= next_tick) {
      deliver(machine_->tick(now));
      next_tick = now + 0.1;
    }
    if (machine_->state().phase == Phase::kFinished) {
      if (finished_at == 0) finished_at = now;
      if (now - finished_at > 3.0) break;  // long enough for every peer to hear Finished
    }
  }
  return machine_->state().finalized_steps();
}

}  // namespace

std::set<net::PublicKey> read_allowlist(const fs::path& path) {
  std::istringstream in(read_file(path));
  std::set<net::PublicKey> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    keys.insert(net::key_from_hex(line.substr(first, last - first + 1),
                                  fmt::format("{} line {}", path.string(), number)));
  }
  if (keys.empty()) {
    fail(
        "allowlist {} holds no key; list one 64-hex public key per line (agora keygen prints "
        "them), or set network.allowlist = \"\" for an open run",
        path.string());
  }
  return keys;
}

uint64_t run_coordinator(const RunConfig& config, const net::Identity& identity,
                         const ServiceOptions& options, const std::atomic<bool>& stop) {
  Service service(config, identity, options);
  return service.run(stop);
}

}  // namespace agora::coord
