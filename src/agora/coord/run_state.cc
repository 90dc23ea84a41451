#include "agora/coord/run_state.h"

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
  }
  return "unknown";
}

}  // namespace agora::coord
