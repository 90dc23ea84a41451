// A SAPO node as its own process: one of a swarm of machines that each keep their own policy and
// share the groups they sample as text (docs/rl.md section 5; sapo.h runs the same swarm in one
// process).
//
// Each round the node samples `own` groups of its own problems with its own policy, keeps them
// to answer the other nodes, asks every peer for its groups of the same round, and trains with
// one GRPO update on its own groups plus `shared` groups drawn (seeded) from the others'
// informative ones. A peer not at the round yet is asked again until `share_wait_seconds` have
// passed; then the round goes on with what came. While it waits it answers its peers, so two
// nodes waiting for each other both proceed.
//
// Nothing a peer sends is trusted but the tokens: each problem is rebuilt from its id by the
// node's own task generator, the rewards come from the checker, and another node's completions
// are scored under this node's policy (ratio 1). A reply is refused, whole, when it is for
// another round, has more groups than `max_groups_per_reply`, or a group names a held-out
// problem, has another size than the run's group size, or a completion that is empty, longer
// than max_new_tokens, or holds a token outside the vocabulary. Only the peers named may connect
// (their keys are the allowlist), and requests from each go through a token bucket.
//
// A reply is whole or refused; of a reply taken, at most `own` groups enter the pool the shared
// groups are drawn from (the first; the rest are counted as capped): one node's share of the pool
// is what an honest node publishes, however many groups it sends.
//
// `behaviour` makes the node publish what its peers must refuse or cap, for tests: garbage
// (tokens outside the vocabulary), held-out (held-out problems with their correct answers) or
// flood (each of its groups eight times, to fill its peers' pools).
//
// Output in `out`: sapo.jsonl (sapo_node_round per round, with the mean reward, the groups
// received, used and refused by reason; sapo_node_summary at the end).
#pragma once

#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/rl/sapo.h"
#include "agora/rl/task.h"
#include "agora/train/checkpoint.h"

namespace agora {

struct SapoPeer {
  std::string endpoint;  // "tcp://host:port"
  net::PublicKey key;    // ed25519
};

// "tcp://host:port@HEXKEY" -> SapoPeer; Error naming the text and the form expected.
SapoPeer parse_sapo_peer(const std::string& text);

struct SapoNodeOptions {
  SapoOptions sapo;  // nodes is unused: the node's peers are `peers`
  std::string task_name = "arithmetic";
  TaskOptions task;
  std::string listen = "tcp://0.0.0.0:7620";
  std::vector<SapoPeer> peers;
  double share_wait_seconds = 60;
  double linger_seconds = 10;  // answering peers after the last round
  int64_t max_groups_per_reply = 64;
  double peer_requests_per_second = 50, peer_burst = 200;
  std::string behaviour = "honest";  // honest | garbage | held-out | flood
  std::filesystem::path out = "runs/sapo-node";
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

// Errors name the option, its value and what is allowed.
void validate(const SapoNodeOptions& options);

struct SapoNodeSummary {
  int64_t rounds = 0;
  double cumulative_reward = 0;  // the sum over rounds of the mean reward of its own samples
  double base_accuracy = 0, accuracy = 0;
  int64_t shared_received = 0, shared_used = 0;
  std::map<std::string, int64_t> refused;  // replies refused, by reason
  int64_t capped = 0;  // groups beyond `own` in replies taken, left out of the pool
  double seconds = 0;
};

SapoNodeSummary run_sapo_node(LoadedCheckpoint base, const net::Identity& identity,
                              const SapoNodeOptions& options);

}  // namespace agora
