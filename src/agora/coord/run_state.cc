#include "agora/coord/run_state.h"

#include <utility>

namespace agora::coord {

std::string to_string(Phase phase) {
  switch (phase) {
    case Phase::kWaitingForPeers:
      return "waiting_for_peers";
    case Phase::kWarmup:
      return "warmup";
    case Phase::kTraining:
      return "training";
    case Phase::kPaused:
      return "paused";
    case Phase::kFinished:
      return "finished";
  }
  return "unknown";
}

std::string to_string(MemberState state) {
  switch (state) {
    case MemberState::kSyncing:
      return "syncing";
    case MemberState::kActive:
      return "active";
    case MemberState::kLeft:
      return "left";
    case MemberState::kDropped:
      return "dropped";
  }
  return "unknown";
}

std::string to_string(DropReason reason) {
  switch (reason) {
    case DropReason::kNone:
      return "none";
    case DropReason::kStrikes:
      return "strikes";
    case DropReason::kHeartbeatTimeout:
      return "heartbeat_timeout";
    case DropReason::kFailedVerification:
      return "failed_verification";
  }
  return "unknown";
}

namespace {

// One table for both directions, so a name can never read back as another kind.
constexpr std::pair<EventKind, std::string_view> kEventKinds[] = {
    {EventKind::kJoin, "join"},
    {EventKind::kCaughtUp, "caught_up"},
    {EventKind::kLeave, "leave"},
    {EventKind::kStrike, "strike"},
    {EventKind::kDrop, "drop"},
    {EventKind::kRejection, "rejection"},
    {EventKind::kIgnored, "ignored"},
    {EventKind::kCheckpoint, "checkpoint"},
    {EventKind::kResync, "resync"},
    {EventKind::kRestart, "restart"},
    {EventKind::kPhase, "phase"},
    {EventKind::kRound, "round"},
    {EventKind::kTstSwitch, "tst_switch"},
    {EventKind::kVerify, "verify"},
    {EventKind::kOther, "other"},
};

}  // namespace

std::string to_string(EventKind kind) {
  for (const auto& [k, name] : kEventKinds) {
    if (k == kind) return std::string(name);
  }
  return "other";
}

EventKind event_kind_from(std::string_view name) {
  for (const auto& [k, n] : kEventKinds) {
    if (n == name) return k;
  }
  return EventKind::kOther;
}

}  // namespace agora::coord
