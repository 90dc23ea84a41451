// The adversary: a member of a run that speaks agora's protocol as an attacker would (test-only;
// docs/security.md, "The adversary"). It joins with a real key on the allowlist, keeps itself a
// member (heartbeats, commits, witnesses), and does the one thing `attack` names:
//
//   wrong-step      commits a well-formed payload whose step field is another step
//   replay          re-commits an old payload (its own or an honest peer's) for the new round
//   scale           an honest payload's values times `factor` (flt-max: +-3e38)
//   sign-flip       an honest payload's values negated
//   noise           random positions and Gaussian values
//   zero            all-zero values (lazy)
//   withhold        commits an honest-looking payload and never serves it
//   steal-endpoint  advertises `advertise` (another member's endpoint) as its own
//   forged-state    state reports: huge (applied_steps 2^64-2), empty (no tensors), fake
//                   (its own hashes), evict (four huge counts)
//   flood           `flood_kind` at `rate` per second for `flood_seconds`
//   oversized       frames of `bytes` to the coordinator or to the peers' servers
//   lying-witness   witnesses that reject every honest payload and hold none
//   silent-witness  never witnesses
//   garbage         commits payloads cut in half (no witness can decode them)
//   copy            (the baseline) commits the newest honest payload it holds, re-stepped
//
// Every other attack also commits such copies, so that it stays a member for the attack's sake
// and a strike means its attack was noticed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/optim/payload.h"
#include "forge.h"
#include "report.h"

namespace agora::adversary {

struct Options {
  std::string coordinator;      // tcp://host:port
  std::string coordinator_key;  // 64 hex
  std::string key;              // its key file (agora keygen), on the run's allowlist
  std::string listen = "tcp://127.0.0.1:*";
  std::string advertise;  // the endpoint it joins with ("": its own)
  std::string data;       // a token folder, for model.vocab_size when the config has none
  std::string attack = "copy";
  uint64_t from_round = 0;  // rounds before this one commit copies
  int64_t claim_step = -1;  // wrong-step: the step written into the payload (-1: round - 1)
  std::string replay_source = "honest";  // replay: honest | own
  double factor = 1e6;                   // scale
  std::string state_mode = "huge";       // forged-state
  std::string flood_kind = "heartbeat";  // heartbeat | get-blob | get-tensor | witness |
                                         // state-report | get-finalized | join | commit
  double rate = 0;                       // flood: messages per second, 0 = as fast as the loop goes
  double flood_seconds = 10;
  double flood_after = 3;              // flood: seconds after joining before it starts
  uint64_t bytes = 2 << 20;            // oversized
  std::string target = "coordinator";  // oversized: coordinator | peers
  // The throughput it acts (sequences per compute second): it commits share / claim_throughput
  // seconds after a round opens, and says so. 50 keeps a share of every round against the tiny
  // model's honest peers, so that it has something to attack with.
  double claim_throughput = 50;
  // Other adversaries' keys (8 hex, as logs print them): their payloads are never taken as
  // the honest payloads it forges from.
  std::vector<std::string> allies;
  bool silent = false;  // never witness, whatever the attack (as silent-witness does)
  double duration = 0;  // give up after this many seconds (0: until the run ends)
  uint64_t seed = 1;
};

class Adversary {
 public:
  explicit Adversary(Options options);
  ~Adversary();
  // Runs until the run finishes, the coordinator refuses it for good, or `duration` passes.
  // The exit code: 0 in each of those cases.
  int run();

 private:
  struct Fetch;
  double now() const;
  void send_join();
  RunConfig parse_config(std::string toml);
  void on_welcome(const wire::Welcome& w);
  void on_coordinator(const wire::Envelope& m);
  void on_round_start(const wire::RoundStart& r);
  void commit_due();  // the commits whose time came
  void on_collect(const wire::Collect& c);
  void on_finalized(uint64_t step);
  void serve(net::Incoming&& in);
  void on_fetch_reply(const std::string& endpoint, wire::Envelope&& reply);
  void witness(uint64_t step);
  void remember_members(const google::protobuf::RepeatedPtrField<wire::Member>& members);
  net::Client& client_for(const std::string& endpoint, const std::string& key);
  void heartbeat();
  void report_state(uint64_t applied);
  void flood_tick();
  void oversized();
  Payload base_for(uint64_t round);
  std::string payload_for(uint64_t round, std::string* what);
  void commit(uint64_t round, const std::string& bytes, const std::string& what, uint64_t seqs);

  Options o_;
  Report report_;
  net::Identity identity_;
  net::PublicKey coordinator_key_;
  std::unique_ptr<net::Context> context_;
  std::unique_ptr<net::Server> server_;
  std::unique_ptr<net::Client> coordinator_;
  std::map<std::string, std::unique_ptr<net::Client>> clients_;  // by endpoint
  std::string endpoint_;
  std::mt19937_64 rng_;

  bool joined_ = false, done_ = false;
  std::string run_id_;
  std::optional<RunConfig> config_;
  PayloadLayout layout_;
  bool layout_checked_ = false;
  uint64_t finalized_ = 0, next_round_ = 0;
  double started_ = 0, joined_at_ = 0, last_join_ = -100, next_heartbeat_ = 0;
  std::map<std::string, std::string> members_;  // key -> endpoint, as the coordinator published
  std::map<std::string, std::string> blobs_;    // hash -> bytes it serves or holds
  std::map<uint64_t, std::string> own_;         // round -> the hash it committed
  struct Honest {
    uint64_t step;
    std::string author, hash;
  };
  std::vector<Honest> honest_;                  // honest payloads fetched, oldest first
  std::map<uint64_t, wire::Envelope> commits_;  // round -> its Commit (re-sent when asked)
  std::map<uint64_t, std::pair<double, uint64_t>> due_;  // round -> (when to commit, its share)
  struct Collecting {
    std::set<std::string> wanted, held, failed;
    std::map<std::string, std::string> authors;  // hash -> author
    double deadline = 0;
    bool sent = false;
  };
  std::map<uint64_t, Collecting> collecting_;
  std::map<std::string, std::pair<uint64_t, double>> asked_;  // hash -> (step, when)
  std::map<std::string, std::string> asked_where_;            // hash -> endpoint
  // Counters for the summary line.
  uint64_t served_ = 0, withheld_ = 0, requests_ = 0, flood_sent_ = 0;
  double flood_start_ = -1, flood_next_ = 0;
  bool flood_done_ = false, oversized_done_ = false;
};

}  // namespace agora::adversary
