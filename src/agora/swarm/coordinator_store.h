// SwarmStore: the swarm coordinator's state on disk, OUT/state.db (SQLite, serve/sqlite.h), so
// that a coordinator killed with SIGKILL and started again with the same arguments resumes the
// run (docs/swarm.md, "Restarts").
//
// It holds the schedule's durable state and clock (schedule.h, "Durability") and every round
// contribution of the current step and of the last completed one. The coordinator saves after
// each batch of messages in which the schedule decided something, and only then sends that
// batch's answers: nothing a peer has heard of (a step finished, a micro-batch given, a round)
// is unknown to a restarted coordinator.
//
// A folder is one run's: opening it for another run (another fingerprint: the run config and the
// schedule's shape) is refused while the run there is unfinished; a finished run's folder is
// taken over by the next run.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "agora/serve/sqlite.h"
#include "agora/swarm/schedule.h"

namespace agora {

class SwarmStore {
 public:
  // Opens or creates DIR/state.db. Throws Error naming the file when it cannot, when it holds an
  // unfinished run of another fingerprint, or was written by another schema.
  SwarmStore(const std::filesystem::path& dir, const std::string& fingerprint);

  struct Saved {
    SwarmSchedule::Durable durable;
    std::vector<SwarmSchedule::Contribution> rounds;
    double age_seconds = 0;  // wall-clock time since the save (the coordinator was down)
  };
  // The run to resume; nothing when there is none (a new folder, or a finished run's).
  std::optional<Saved> load();

  // Commits `durable` and the contributions that `arrived` since the last save, and forgets
  // the contributions of steps before the last completed one. Durable when it returns.
  void save(const SwarmSchedule::Durable& durable,
            const std::vector<SwarmSchedule::Contribution>& arrived);

 private:
  std::filesystem::path path_;
  serve::DatabaseHandle db_;
};

}  // namespace agora
