// clang-format off
// The catalogue: every metric agora exports, with its type, labels and meaning.
//
// This is the one list of names; the code registers metrics through these definitions only,
// so a name cannot drift from what the dashboards (deploy/grafana/) and docs/monitoring.md
// query. Units are Prometheus' base units (seconds, bytes); counters end in _total.
//
// | metric | type | labels | meaning |
// |---|---|---|---|
// | coordinator (`agora coordinator --http`) | | | |
// | agora_run_info | gauge | run_id, preset, optimizer | always 1; the run's identity |
// | agora_run_phase | gauge | phase (waiting_for_peers, warmup, training, paused, finished) | 1 for the current phase, 0 for the others |
// | agora_run_finalized_steps | gauge | | steps final so far |
// | agora_run_total_steps | gauge | | train.steps |
// | agora_run_loss | gauge | | median of the losses the final payloads' authors claimed, newest finalized step (absent until known) |
// | agora_run_val_loss | gauge | | newest validation loss reported by a checkpointer (absent until one is) |
// | agora_run_learning_rate | gauge | | the schedule's learning rate at the newest finalized step |
// | agora_run_tokens_per_second | gauge | | tokens trained per second, newest finalized step |
// | agora_run_peers | gauge | state (syncing, active, left, dropped) | members by state |
// | agora_run_round_duration_seconds | histogram | | round open to commit phase closed |
// | agora_run_deadline_misses_total | counter | | assigned members that did not commit by the deadline |
// | agora_run_joins_total | counter | | accepted joins (rejoins included) |
// | agora_run_leaves_total | counter | | Leave messages |
// | agora_run_drops_total | counter | | members dropped (strikes, silence or failed spot checks) |
// | agora_run_refusals_total | counter | | Refused answers sent |
// | agora_run_commits_total | counter | result (accepted, rejected, late) | commits received |
// | agora_run_payloads_total | counter | result (final, not_final) | committed payloads at finalization |
// | agora_run_payload_rejections_reported_total | counter | | payloads witnesses reported failing verification |
// | agora_run_payload_bytes_total | counter | | bytes of the payloads in finalized steps, all authors |
// | agora_run_allreduce_equivalent_bytes_total | counter | | what an fp32 all-reduce would have sent for the same steps, all peers |
// | agora_run_checkpoints_total | counter | | checkpoint reports |
// | agora_run_resyncs_total | counter | | Resync messages sent |
// | agora_run_restarts_total | counter | | restarts from a checkpoint after every member left |
// | agora_run_messages_throttled_total | counter | | messages dropped because their sender exceeded 100 a second (bursts of 1000) |
// | agora_run_reports_refused_total | counter | kind (state, checkpoint) | reports refused: ahead of the ledger, off schedule, malformed, inconsistent, or contradicting the state a quorum reported |
// | agora_run_witnesses_repeated_total | counter | | second and later Witness messages of one member for one step (ignored) |
// | agora_run_witness_disagreements_total | counter | | witness reports (held or missing) the payload's outcome contradicted |
// | agora_run_events_suppressed_total | counter | | ignored or rejected messages of one member beyond 16 per round (counted, not recorded) |
// | peer (`agora peer --metrics`) | | | |
// | agora_peer_step | gauge | | finalized steps applied |
// | agora_peer_loss | gauge | | mean loss of the peer's share in its newest round |
// | agora_peer_learning_rate | gauge | | learning rate of its newest round |
// | agora_peer_tokens_per_second | gauge | | tokens of its newest round / that round's compute seconds |
// | agora_peer_share | gauge | | fraction of the newest round's sequences assigned to it |
// | agora_peer_time_seconds_total | counter | activity (compute, waiting, applying, fetching_state, checkpointing) | where the peer's time went |
// | agora_peer_payloads_accepted_total | counter | | payloads fetched and verified |
// | agora_peer_payloads_rejected_total | counter | reason (hash, signature, layout, unavailable) | payloads refused |
// | agora_peer_fetch_duration_seconds | histogram | kind (payload: one payload; state: a whole model state) | fetch latency |
// | agora_peer_checkpoint_duration_seconds | histogram | | writing one checkpoint |
// | agora_peer_rounds_total | counter | | rounds trained (non-empty share) |
// | agora_peer_resyncs_total | counter | | Resync messages acted on |
// | agora_peer_apply_decisions_total | counter | decision (refused: a finalized contribution left out; clipped: a contribution's tensor scaled down to the bound; skipped: a step whose update was not finite) | what applying finalized steps decided about hostile contributions (docs/security.md) |
// | agora_peer_requests_refused_total | counter | reason (not_member, member_rate, connection_rate, reply_queue, bytes_in_flight, bad_request) | requests to the peer's server answered with no data |
// | agora_peer_witnesses_early_total | counter | | Witnesses sent at their deadline with payloads still being fetched |
// | agora_peer_payloads_late_total | counter | | payloads accepted after their step's Witness went out (kept for apply) |
// | agora_peer_unsolicited_replies_total | counter | | replies on fetch connections that answered nothing asked (dropped) |
// | agora_peer_io_errors_total | counter | | ZeroMQ errors the network thread caught and survived |
// | agora_peer_fetch_connections | gauge | | connections open to other members' servers |
// | both | | | |
// | agora_network_bytes_total | counter | direction (sent, received), kind (payload, state, control) | encoded message bytes; the coordinator only has control |
// | agora_network_messages_dropped_total | counter | reason (frames, unauthenticated, too_large, unparsable, no_body, over_limit) | malformed messages dropped |
// | RL learner (`agora rl serve --http`) | | | |
// | agora_rl_step | gauge | | GRPO updates done |
// | agora_rl_total_steps | gauge | | updates the run makes |
// | agora_rl_reward | gauge | | mean reward of the newest update's completions |
// | agora_rl_held_out_accuracy | gauge | | newest held-out accuracy (greedy) |
// | agora_rl_rollouts_per_second | gauge | | rollouts submitted per second since the start |
// | agora_rl_rollouts_total | counter | verdict (accepted, banned, malformed, wrong_task, stale, future, unknown, duplicate, mismatch, unassigned, bad_signature) | rollouts received, by what became of them |
// | agora_rl_workers | gauge | state (active, banned) | workers that said hello |
// | agora_rl_policy_bytes_total | counter | kind (delta, whole) | policy bytes queued to workers |
// | agora_rl_messages_dropped_total | counter | reason (unregistered, rate_limited, policy_busy, unexpected) | worker messages dropped unanswered |
// | asynchronous data parallelism's outer server (`agora async serve --http`) | | | |
// | agora_async_updates | gauge | | outer updates applied to theta (its version) |
// | agora_async_deliveries_total | counter | verdict (accepted, stale, unassigned, bad_signature, malformed, outlier) | pseudo-gradients received, by what became of them |
// | agora_async_tokens | gauge | | tokens trained in accepted deliveries |
// | agora_async_staleness | gauge | | versions between the newest accepted delivery's pull and its arrival |
// | agora_async_workers | gauge | state (active, banned) | workers that said hello |
// | agora_async_run_seconds | gauge | | seconds since the run started (0 while it waits for its workers) |
// | the swarm's coordinator (`agora swarm serve --http`) | | | |
// | agora_swarm_step | gauge | | the step the swarm trains (steps done) |
// | agora_swarm_phase | gauge | phase (waiting, training, syncing, finished) | 1 for the current phase |
// | agora_swarm_samples_per_second | gauge | | samples of finished steps per second since the start |
// | agora_swarm_ideal_samples_per_second | gauge | | the bottleneck of the replicas' solo throughputs, averaged |
// | agora_swarm_stage_throughput | gauge | stage | samples per second the stage's serving replicas can do |
// | agora_swarm_replicas | gauge | stage, state (serving, loading) | members per stage |
// | agora_swarm_lost_total | counter | | members lost (silent) or restarted |
// | agora_swarm_moves_total | counter | | rebalancing moves |
// | agora_swarm_retried_total | counter | | micro-batches stage 0 sent again |
// | process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes, process_start_time_seconds, process_open_fds | | | the standard process metrics |
//
// A peer does not learn whether it missed a deadline (the coordinator strikes it silently), so
// there is no agora_peer_deadline_misses_total; agora_run_deadline_misses_total counts them.
// clang-format on
#pragma once

#include <string_view>

#include "agora/obs/metrics.h"

namespace agora::obs {

struct MetricDef {
  std::string_view name;
  std::string_view help;
};

namespace metric {
// clang-format off
inline constexpr MetricDef kRunInfo{"agora_run_info", "The run's identity; always 1."};
inline constexpr MetricDef kRunPhase{"agora_run_phase", "1 for the run's current phase, 0 for the others."};
inline constexpr MetricDef kRunFinalizedSteps{"agora_run_finalized_steps", "Steps final so far."};
inline constexpr MetricDef kRunTotalSteps{"agora_run_total_steps", "Steps the run trains (train.steps)."};
inline constexpr MetricDef kRunLoss{"agora_run_loss", "Median of the losses the final payloads' authors claimed, newest finalized step."};
inline constexpr MetricDef kRunValLoss{"agora_run_val_loss", "Validation loss of the newest evaluation."};
inline constexpr MetricDef kRunLearningRate{"agora_run_learning_rate", "Learning rate at the newest finalized step."};
inline constexpr MetricDef kRunTokensPerSecond{"agora_run_tokens_per_second", "Tokens trained per second over the newest finalized step."};
inline constexpr MetricDef kRunPeers{"agora_run_peers", "Members by state."};
inline constexpr MetricDef kRunRoundDuration{"agora_run_round_duration_seconds", "Time from a round's opening to the close of its commit phase."};
inline constexpr MetricDef kRunDeadlineMisses{"agora_run_deadline_misses_total", "Assigned members that did not commit before their round's deadline."};
inline constexpr MetricDef kRunJoins{"agora_run_joins_total", "Accepted joins, rejoins included."};
inline constexpr MetricDef kRunLeaves{"agora_run_leaves_total", "Members that said Leave."};
inline constexpr MetricDef kRunDrops{"agora_run_drops_total",
                                     "Members dropped for strikes, silence or failed spot checks."};
inline constexpr MetricDef kRunRefusals{"agora_run_refusals_total", "Refused answers sent."};
inline constexpr MetricDef kRunCommits{"agora_run_commits_total", "Commits received, by what became of them."};
inline constexpr MetricDef kRunPayloads{"agora_run_payloads_total", "Committed payloads at finalization: final or not."};
inline constexpr MetricDef kRunRejectionsReported{"agora_run_payload_rejections_reported_total", "Payloads that witnesses reported as failing verification."};
inline constexpr MetricDef kRunPayloadBytes{"agora_run_payload_bytes_total", "Bytes of the payloads in finalized steps, all authors together."};
inline constexpr MetricDef kRunAllreduceBytes{"agora_run_allreduce_equivalent_bytes_total", "Bytes an fp32 gradient all-reduce would have sent for the same steps, all peers together (4 x parameters per peer per step)."};
inline constexpr MetricDef kRunCheckpoints{"agora_run_checkpoints_total", "Checkpoint reports received."};
inline constexpr MetricDef kRunResyncs{"agora_run_resyncs_total", "Resync messages sent."};
inline constexpr MetricDef kRunRoundStartsHeld{"agora_run_round_starts_held_total", "RoundStarts the coordinator did not send again because the last one to that member still waited in its send queue."};
inline constexpr MetricDef kRunMessagesThrottled{"agora_run_messages_throttled_total", "Messages dropped because their sender exceeded its rate (100 a second, bursts of 1000)."};
inline constexpr MetricDef kRunReportsRefused{"agora_run_reports_refused_total", "State or checkpoint reports refused: ahead of the ledger, off schedule, malformed, inconsistent, or contradicting the state a quorum reported."};
inline constexpr MetricDef kRunWitnessesRepeated{"agora_run_witnesses_repeated_total", "Second and later Witness messages of one member for one step, ignored."};
inline constexpr MetricDef kRunWitnessDisagreements{"agora_run_witness_disagreements_total", "Witness reports (held or missing) that the payload's outcome contradicted."};
inline constexpr MetricDef kRunEventsSuppressed{"agora_run_events_suppressed_total", "Ignored or rejected messages of one member beyond 16 per round: counted, not recorded as events."};
inline constexpr MetricDef kRunRestarts{"agora_run_restarts_total", "Restarts from a checkpoint after every member left."};

inline constexpr MetricDef kPeerStep{"agora_peer_step", "Finalized steps applied."};
inline constexpr MetricDef kPeerLoss{"agora_peer_loss", "Mean loss of the peer's share in its newest round."};
inline constexpr MetricDef kPeerLearningRate{"agora_peer_learning_rate", "Learning rate of the peer's newest round."};
inline constexpr MetricDef kPeerTokensPerSecond{"agora_peer_tokens_per_second", "Tokens per compute second in the peer's newest round."};
inline constexpr MetricDef kPeerShare{"agora_peer_share", "Fraction of the newest round's sequences assigned to this peer."};
inline constexpr MetricDef kPeerTime{"agora_peer_time_seconds_total", "Seconds spent per activity."};
inline constexpr MetricDef kPeerPayloadsAccepted{"agora_peer_payloads_accepted_total", "Payloads fetched and verified."};
inline constexpr MetricDef kPeerPayloadsRejected{"agora_peer_payloads_rejected_total", "Payloads refused, by reason."};
inline constexpr MetricDef kPeerFetchDuration{"agora_peer_fetch_duration_seconds", "Time to fetch one payload (kind=payload) or a whole model state (kind=state)."};
inline constexpr MetricDef kPeerCheckpointDuration{"agora_peer_checkpoint_duration_seconds", "Time to write one checkpoint."};
inline constexpr MetricDef kPeerRounds{"agora_peer_rounds_total", "Rounds trained with a non-empty share."};
inline constexpr MetricDef kPeerResyncs{"agora_peer_resyncs_total", "Resync messages acted on."};
inline constexpr MetricDef kPeerApplyDecisions{"agora_peer_apply_decisions_total", "Finalized contributions left out (refused), scaled down to the influence bound per tensor (clipped), and steps not applied because their update was not finite (skipped)."};
inline constexpr MetricDef kPeerRequestsRefused{"agora_peer_requests_refused_total", "Requests to the peer's server answered with no data, by reason."};
inline constexpr MetricDef kPeerWitnessesEarly{"agora_peer_witnesses_early_total", "Witnesses sent at their deadline with payloads still being fetched."};
inline constexpr MetricDef kPeerPayloadsLate{"agora_peer_payloads_late_total", "Payloads accepted after their step's Witness went out."};
inline constexpr MetricDef kPeerUnsolicitedReplies{"agora_peer_unsolicited_replies_total", "Replies on fetch connections that answered nothing asked."};
inline constexpr MetricDef kPeerFetchConnections{"agora_peer_fetch_connections", "Connections open to other members' servers."};
inline constexpr MetricDef kPeerIoErrors{"agora_peer_io_errors_total", "ZeroMQ errors the network thread caught and survived."};

inline constexpr MetricDef kNetworkBytes{"agora_network_bytes_total", "Bytes of messages sent and received, by kind."};
inline constexpr MetricDef kRlStep{"agora_rl_step", "GRPO updates done."};
inline constexpr MetricDef kRlTotalSteps{"agora_rl_total_steps", "GRPO updates the run makes."};
inline constexpr MetricDef kRlReward{"agora_rl_reward", "Mean reward of the newest update's completions."};
inline constexpr MetricDef kRlHeldOutAccuracy{"agora_rl_held_out_accuracy", "Newest held-out accuracy (greedy)."};
inline constexpr MetricDef kRlRolloutsPerSecond{"agora_rl_rollouts_per_second", "Rollouts submitted per second since the start."};
inline constexpr MetricDef kRlRollouts{"agora_rl_rollouts_total", "Rollouts received, by verdict."};
inline constexpr MetricDef kRlWorkers{"agora_rl_workers", "Rollout workers that said hello, by state."};
inline constexpr MetricDef kRlPolicyBytes{"agora_rl_policy_bytes_total", "Policy bytes queued to workers, by kind."};
inline constexpr MetricDef kRlMessagesDropped{"agora_rl_messages_dropped_total", "Worker messages dropped unanswered, by reason."};
inline constexpr MetricDef kAsyncUpdates{"agora_async_updates", "Outer updates applied to theta (its version)."};
inline constexpr MetricDef kAsyncDeliveries{"agora_async_deliveries_total", "Pseudo-gradients received, by verdict."};
inline constexpr MetricDef kAsyncTokens{"agora_async_tokens", "Tokens trained in accepted deliveries."};
inline constexpr MetricDef kAsyncStaleness{"agora_async_staleness", "Versions between the newest accepted delivery's pull and its arrival."};
inline constexpr MetricDef kAsyncWorkers{"agora_async_workers", "Workers that said hello, by state."};
inline constexpr MetricDef kAsyncRunSeconds{"agora_async_run_seconds", "Seconds since the run started (0 while it waits for its workers)."};
inline constexpr MetricDef kSwarmStep{"agora_swarm_step", "The step the swarm trains (steps done)."};
inline constexpr MetricDef kSwarmPhase{"agora_swarm_phase", "1 for the swarm's current phase."};
inline constexpr MetricDef kSwarmSamplesPerSecond{"agora_swarm_samples_per_second", "Samples of finished steps per second since the start."};
inline constexpr MetricDef kSwarmIdeal{"agora_swarm_ideal_samples_per_second", "The bottleneck of the serving replicas' solo throughputs, averaged over the run."};
inline constexpr MetricDef kSwarmStageThroughput{"agora_swarm_stage_throughput", "Samples per second a stage's serving replicas can do."};
inline constexpr MetricDef kSwarmReplicas{"agora_swarm_replicas", "Members per stage, by state."};
inline constexpr MetricDef kSwarmLost{"agora_swarm_lost_total", "Members lost (silent) or restarted."};
inline constexpr MetricDef kSwarmMoves{"agora_swarm_moves_total", "Rebalancing moves."};
inline constexpr MetricDef kSwarmRetried{"agora_swarm_retried_total", "Micro-batches stage 0 sent again."};

inline constexpr MetricDef kNetworkDropped{"agora_network_messages_dropped_total", "Malformed messages dropped, by reason."};
// clang-format on
}  // namespace metric

inline Counter& counter(Registry& r, const MetricDef& d, const Labels& labels = {}) {
  return r.counter(d.name, d.help, labels);
}
inline Gauge& gauge(Registry& r, const MetricDef& d, const Labels& labels = {}) {
  return r.gauge(d.name, d.help, labels);
}
inline Histogram& histogram(Registry& r, const MetricDef& d, std::vector<double> bounds,
                            const Labels& labels = {}) {
  return r.histogram(d.name, d.help, std::move(bounds), labels);
}

}  // namespace agora::obs
