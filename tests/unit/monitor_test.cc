// The coordinator's monitor: step rows survive the store (NaN included, rollback deletes),
// /api/history's since and paging, event kinds, and /metrics from a published view.
#include "agora/coord/monitor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace agora::coord {
namespace {

StepRow row(uint64_t step, double loss) {
  StepRow r;
  r.step = step;
  r.at = 1000.0 + static_cast<double>(step);
  r.loss = loss;
  r.val_loss = NAN;
  r.learning_rate = 0.01;
  r.tokens_per_second = 100;
  r.payload_bytes = 10;
  r.allreduce_bytes = 400;
  r.peers = 2;
  return r;
}

TEST(MonitorStore, StepRowsPersistAndRollBack) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("agora_monitor_test_" + std::to_string(::getpid()) + ".db");
  std::filesystem::remove(path);
  {
    Store store = Store::open(path);
    store.bind("run", "toml");
    RunState s;
    s.finalized.resize(3);
    store.save(s, false, {row(0, 5.0), row(1, NAN), row(2, 4.0)});
    const auto rows = store.step_rows();
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].loss, 5.0);
    EXPECT_TRUE(std::isnan(rows[1].loss));
    EXPECT_TRUE(std::isnan(rows[2].val_loss));
    s.finalized.resize(1);  // back to a checkpoint after step 0
    store.save(s, /*allow_rollback=*/true);
    EXPECT_EQ(Store::open(path).step_rows().size(), 1u);
  }
  std::filesystem::remove(path);
}

TEST(Monitor, HistorySinceAndEvents) {
  Monitor monitor({"run", "tiny", "demo", 1000, 24, 64, 10, 0}, {row(0, 5), row(1, 4.5)});
  monitor.add_rows({row(2, NAN)});
  auto view = std::make_shared<RunView>();
  view->events = {
      {1, 1.0, "8281c336 joined (agora 0.1.0) at tcp://x:1 as active; 1 active", EventKind::kJoin},
      {2, 2.0, "phase warmup -> training (2 active, min_peers 2)", EventKind::kPhase}};
  monitor.publish(view);
  const auto all = nlohmann::json::parse(monitor.history_json(0, false, 0));
  ASSERT_EQ(all["steps"].size(), 3u);
  EXPECT_TRUE(all["steps"][2]["loss"].is_null());
  EXPECT_FALSE(all["steps"][0].contains("val_loss"));
  EXPECT_EQ(all["events"][0]["kind"], "join");
  EXPECT_EQ(all["events"][1]["kind"], "phase");
  const auto later = nlohmann::json::parse(monitor.history_json(0, true, 1));
  ASSERT_EQ(later["steps"].size(), 2u);
  EXPECT_EQ(later["steps"][0]["step"], 1);
  EXPECT_EQ(later["events"].size(), 1u);
  monitor.truncate(1);
  EXPECT_EQ(nlohmann::json::parse(monitor.history_json(0, false, 0))["steps"].size(), 1u);
}

// A long history comes in pages of kMaxHistoryRows with "more"; the validation loss of
// /api/run is the newest one reported, not only the newest row's.
TEST(Monitor, HistoryPagesAndNewestValidation) {
  std::vector<StepRow> rows;
  for (uint64_t s = 0; s < Monitor::kMaxHistoryRows + 10; ++s) rows.push_back(row(s, 5.0));
  rows[7].val_loss = 4.25;
  Monitor monitor({"run", "tiny", "demo", 100000, 24, 64, 10, 0}, rows);
  monitor.publish(std::make_shared<RunView>());
  const auto first = nlohmann::json::parse(monitor.history_json(0, false, 0));
  EXPECT_EQ(first["steps"].size(), Monitor::kMaxHistoryRows);
  EXPECT_EQ(first["more"], true);
  const uint64_t last = first["steps"].back()["step"];
  const auto rest = nlohmann::json::parse(monitor.history_json(last, true, 0));
  EXPECT_EQ(rest["steps"].size(), 10u);
  EXPECT_FALSE(rest.contains("more"));
  EXPECT_EQ(nlohmann::json::parse(monitor.run_json())["val_loss"], 4.25);
}

TEST(Monitor, EventKindNamesRoundTrip) {
  for (EventKind k : {EventKind::kJoin, EventKind::kCaughtUp, EventKind::kLeave, EventKind::kStrike,
                      EventKind::kDrop, EventKind::kRejection, EventKind::kIgnored,
                      EventKind::kCheckpoint, EventKind::kResync, EventKind::kRestart,
                      EventKind::kPhase, EventKind::kRound, EventKind::kTstSwitch}) {
    EXPECT_NE(to_string(k), "other");
    EXPECT_EQ(event_kind_from(to_string(k)), k) << to_string(k);
  }
  EXPECT_EQ(event_kind_from("no such kind"), EventKind::kOther);
}

TEST(Monitor, MetricsFromTheView) {
  Monitor monitor({"run", "tiny", "demo", 1000, 24, 64, 10, 0}, {row(0, 5)});
  auto view = std::make_shared<RunView>();
  view->phase = Phase::kTraining;
  view->finalized_steps = 1;
  view->counters.joins = 2;
  MemberRecord m;
  m.state = MemberState::kActive;
  view->members = {{m, 1.0, 10, 1}};
  view->drops_by_reason = {{"unparsable", 3}};
  monitor.publish(view);
  monitor.observe_round(0.5);
  const std::string text = monitor.registry().render();
  for (const char* line :
       {"agora_run_phase{phase=\"training\"} 1\n", "agora_run_phase{phase=\"paused\"} 0\n",
        "agora_run_peers{state=\"active\"} 1\n", "agora_run_joins_total 2\n", "agora_run_loss 5\n",
        "agora_run_payload_bytes_total 20\n", "agora_run_allreduce_equivalent_bytes_total 800\n",
        "agora_network_messages_dropped_total{reason=\"unparsable\"} 3\n",
        "agora_run_round_duration_seconds_count 1\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  EXPECT_EQ(text.find("agora_run_val_loss"), std::string::npos);  // not known: not exported
  const auto run = nlohmann::json::parse(monitor.run_json());
  EXPECT_EQ(run["phase"], "training");
  EXPECT_EQ(run["peers"]["active"], 1);
  EXPECT_FALSE(run.contains("val_loss"));
}

}  // namespace
}  // namespace agora::coord
