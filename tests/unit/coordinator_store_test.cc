// The coordinator's SQLite store: round trips, the append-only ledger, reopening, refusals.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

#include "agora/coord/run_state_json.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/store.h"
#include "agora/net/identity.h"
#include "test_support.h"

namespace agora::coord {
namespace {

std::string bytes(char c, size_t n = 32) {
  return std::string(n, c);
}

// A state with every part filled in, bytes that are not text included.
RunState sample_state() {
  RunState s;
  s.phase = Phase::kTraining;
  s.phase_since = 1'700'000'000.125;
  const PublicKey a = bytes('\x01');
  const PublicKey b = bytes('\xfe');
  MemberRecord ma;
  ma.key = a;
  ma.endpoint = "tcp://10.0.0.1:7500";
  ma.agent = "agora 0.1.0";
  ma.state = MemberState::kActive;
  ma.strikes = 1;
  ma.sequences_per_second = 12.345678901234567;
  ma.last_seen = 1'700'000'010.5;
  ma.applied_steps = 3;
  ma.checkpointer = true;
  ma.joined_at = 1'700'000'000.0;
  MemberRecord mb = ma;
  mb.key = b;
  mb.endpoint = "tcp://10.0.0.2:7500";
  mb.state = MemberState::kDropped;
  mb.drop_reason = DropReason::kHeartbeatTimeout;
  mb.checkpointer = false;
  s.members[a] = ma;
  s.members[b] = mb;
  s.finalized = {{{a, 0, bytes('\x00'), bytes('\x05', 64)}},
                 {},
                 {{a, 2, bytes('h'), bytes('s', 64)}, {b, 2, bytes('i'), bytes('t', 64)}}};
  s.next_step = 4;
  OpenRound round;
  round.step = 4;
  round.apply_through = 3;
  round.report_state = true;
  round.opened_at = 1'700'000'020.25;
  round.deadline = 1'700'000'030.25;
  round.assignments[a] = {{40, 6}, {100, 2}};
  round.assignments[b] = {};
  round.commits[a] = {a, 4, bytes('p'), bytes('q', 64)};
  s.round = round;
  CollectingStep c;
  c.step = 3;
  c.commits = {{a, 3, bytes('x'), bytes('y', 64)}};
  c.ranges[a] = {{30, 10}};
  c.expected = {a, b};
  c.witnessed = {{a, std::string(1, '\x01')}};  // it holds commit 0
  c.deadline = 1'700'000'025.0;
  s.collecting[3] = c;
  s.queue.pending = {{7, 3}};
  s.queue.next_fresh = 102;
  HashReports r;
  r.reported[a] = bytes('m');
  r.reported[b] = bytes('n');
  r.records[bytes('m')] = {0, bytes('m'), {"w1", "w2"}, {bytes('\x10'), bytes('\x11')}};
  r.records[bytes('n')] = {0, bytes('n'), {"w1", "w2"}, {bytes('\x10'), bytes('\x12')}};
  r.resynced = {b};
  s.state_reports[0] = r;
  s.checkpoints = {{0, bytes('m'), "runs/x/step_0", a, 1'700'000'001.0}};
  s.events = {{1, 1'700'000'000.0, "a joined"}, {2, 1'700'000'000.5, "b joined"}};
  s.counters.joins = 2;
  s.counters.events = 2;
  s.counters.payloads_final = 3;
  s.counters.commits_rejected = 7;
  return s;
}

class CoordinatorStoreTest : public testing::TempDirTest {
 protected:
  std::filesystem::path db() const { return dir_ / "coordinator.db"; }
};

TEST_F(CoordinatorStoreTest, AFreshFileHasNoRunAndNoState) {
  Store store = Store::open(db());
  EXPECT_FALSE(store.run().has_value());
  EXPECT_FALSE(store.load().has_value());
  store.bind("run-1", "seed = 1\n");
  EXPECT_FALSE(store.load().has_value());
  ASSERT_TRUE(store.run().has_value());
  EXPECT_EQ(store.run()->run_id, "run-1");
  EXPECT_EQ(store.run()->run_config_toml, "seed = 1\n");
}

TEST_F(CoordinatorStoreTest, SaveLoadRoundTrip) {
  Store store = Store::open(db());
  store.bind("run-1", "toml");
  const RunState s = sample_state();
  store.save(s);
  std::optional<RunState> loaded = store.load();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->members, s.members);
  EXPECT_EQ(loaded->finalized, s.finalized);
  EXPECT_EQ(loaded->round, s.round);
  EXPECT_EQ(loaded->collecting, s.collecting);
  EXPECT_EQ(loaded->queue, s.queue);
  EXPECT_EQ(loaded->state_reports, s.state_reports);
  EXPECT_EQ(loaded->checkpoints, s.checkpoints);
  EXPECT_EQ(loaded->events, s.events);
  EXPECT_EQ(loaded->counters, s.counters);
  EXPECT_TRUE(*loaded == s);
  // A state without an open round round-trips too.
  RunState idle = s;
  idle.round.reset();
  idle.collecting.clear();
  store.save(idle);
  EXPECT_TRUE(*store.load() == idle);
}

TEST_F(CoordinatorStoreTest, SavingAgainAppendsTheLedgerOnce) {
  Store store = Store::open(db());
  store.bind("run-1", "toml");
  RunState s = sample_state();
  store.save(s);
  store.save(s);
  s.finalized.push_back({{bytes('\x01'), 3, bytes('z'), bytes('w', 64)}});
  s.events.push_back({3, 1'700'000'040.0, "step 3 final"});
  s.counters.events = 3;
  store.save(s);
  store.save(s);
  EXPECT_TRUE(*store.load() == s);
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &raw), SQLITE_OK);
  auto count = [&](const char* sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(raw, sql, -1, &stmt, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_step(stmt), SQLITE_ROW);
    const int64_t n = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return n;
  };
  EXPECT_EQ(count("SELECT COUNT(*) FROM ledger"), 4);
  EXPECT_EQ(count("SELECT COUNT(*) FROM finalized_steps"), 4);
  EXPECT_EQ(count("SELECT COUNT(*) FROM events"), 3);
  sqlite3_close(raw);
  // A state whose ledger is shorter than the file's is refused, and the file keeps its state.
  RunState shorter = s;
  shorter.finalized.pop_back();
  shorter.next_step = 99;
  EXPECT_ERROR_WITH(store.save(shorter), db().string(), "never shrinks");
  EXPECT_TRUE(*store.load() == s);
  // ... unless the run went back to a checkpoint, which the caller says explicitly.
  store.save(shorter, /*allow_rollback=*/true);
  EXPECT_TRUE(*store.load() == shorter);
  store.save(s);  // and the ledger grows again from there
  EXPECT_TRUE(*store.load() == s);
}

// A save writes only what changed since the previous one (store.h, "What a save writes"): every
// kind of change, additions and removals, must read back the same, from the same Store and from
// the file reopened. Each step below changes one part, the way a run does between two saves.
TEST_F(CoordinatorStoreTest, EveryChangeBetweenSavesReadsBack) {
  Store store = Store::open(db());
  store.bind("run-1", "toml");
  RunState s = sample_state();
  const PublicKey a = bytes('\x01'), b = bytes('\xfe'), c = bytes('\x33');
  int saves = 0;
  const auto check = [&](const char* what) {
    store.save(s);
    ++saves;
    const std::optional<RunState> same = store.load();
    ASSERT_TRUE(same.has_value()) << what;
    EXPECT_TRUE(*same == s) << what;
    const std::optional<RunState> reopened = Store::open(db()).load();
    ASSERT_TRUE(reopened.has_value()) << what;
    EXPECT_TRUE(*reopened == s) << what;
  };
  check("the first save");
  // A heartbeat alone writes nothing: the row keeps the time of its last other change.
  const double seen = s.members[a].last_seen;
  s.members[a].last_seen += 1.0;
  store.save(s);
  EXPECT_EQ(Store::open(db()).load()->members.at(a).last_seen, seen);
  s.members[a].strikes += 1;
  check("a member changed");
  MemberRecord joiner = s.members[a];
  joiner.key = c;
  joiner.endpoint = "tcp://10.0.0.3:7500";
  s.members[c] = joiner;
  check("a member joined");
  s.members.erase(b);
  check("a member was forgotten");
  s.round->commits[c] = {c, 4, bytes('r'), bytes('s', 64)};
  check("a commit arrived");
  s.round->commits[c].signature = bytes('S', 64);
  check("a commit changed");
  s.round->commits.erase(a);
  check("a commit went");
  s.round->deadline += 5;
  check("the round's deadline moved");
  // A witness more for step 3, with what it holds.
  s.collecting[3].witnessed[c] = std::string(1, '\x01');
  check("a witness answered");
  s.collecting[3].witnessed[b] = std::string(1, '\0');  // one that held nothing
  check("a witness that held nothing");
  // The round closes: its commits become a collecting step, the next round opens.
  CollectingStep four;
  four.step = 4;
  for (const auto& [key, commit] : s.round->commits) four.commits.push_back(commit);
  four.expected = {a, c};
  four.deadline = 1'700'000'050.0;
  s.collecting[4] = four;
  s.round->step = 5;
  s.round->commits.clear();
  s.round->commits[a] = {a, 5, bytes('u'), bytes('v', 64)};
  check("the round closed and the next opened");
  s.collecting[4].witnessed[a] = std::string(1, '\x01');
  check("a witness of the new step");
  // Step 3 finalizes and leaves the collecting steps.
  s.finalized.push_back(s.collecting[3].commits);
  s.collecting.erase(3);
  check("a step finalized");
  s.state_reports[0].reported[c] = bytes('m');
  s.state_reports[0].resynced.erase(b);
  s.state_reports[0].reported.erase(b);
  s.state_reports[0].records.erase(bytes('n'));
  check("reports changed");
  s.state_reports[5].reported[a] = bytes('k');
  s.state_reports[5].records[bytes('k')] = {5, bytes('k'), {"w1"}, {bytes('\x20')}};
  s.state_reports.erase(0);
  check("a report step came and one went");
  s.checkpoints.push_back({5, bytes('k'), "runs/x/step_5", c, 1'700'000'060.0});
  check("a checkpoint");
  s.round.reset();
  s.collecting.clear();
  check("no round in flight");
  EXPECT_EQ(saves, 17);
}

// Files written before saves were split hold the whole in-flight state as one JSON value: they
// still load, and the next save rewrites them in the split form.
TEST_F(CoordinatorStoreTest, AFileWrittenBeforeTheSplitLoads) {
  const RunState s = sample_state();
  {
    Store store = Store::open(db());
    store.bind("run-1", "toml");
    store.save(s);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &raw), SQLITE_OK);
  const std::string old = volatile_json(s).dump();
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(raw, "UPDATE run SET value = ? WHERE key = 'state'", -1, &stmt, nullptr),
      SQLITE_OK);
  sqlite3_bind_text(stmt, 1, old.c_str(), static_cast<int>(old.size()), SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_DONE);
  sqlite3_finalize(stmt);
  ASSERT_EQ(sqlite3_exec(raw,
                         "DELETE FROM run WHERE key IN ('round', 'collecting'); "
                         "DROP TABLE round_commits; DROP TABLE witness_holdings;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  Store store = Store::open(db());
  ASSERT_TRUE(store.load().has_value());
  EXPECT_TRUE(*store.load() == s);
  RunState next = s;
  next.collecting[3].witnessed[bytes('\xfe')] = std::string(1, '\0');
  store.save(next);
  EXPECT_TRUE(*Store::open(db()).load() == next);
}

TEST_F(CoordinatorStoreTest, ReopenAfterCloseGivesTheSameState) {
  const RunState s = sample_state();
  {
    Store store = Store::open(db());
    store.bind("run-1", "toml");
    store.save(s);
  }
  Store again = Store::open(db());
  ASSERT_TRUE(again.run().has_value());
  EXPECT_EQ(again.run()->run_id, "run-1");
  std::optional<RunState> loaded = again.load();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(*loaded == s);
  // The same run binds again; another run does not.
  again.bind("run-1", "toml");
  EXPECT_ERROR_WITH(again.bind("run-2", "toml"), db().string(), "run-1", "run-2");
}

TEST_F(CoordinatorStoreTest, AnotherSchemaVersionIsAClearError) {
  { Store::open(db()); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "UPDATE meta SET value = '99' WHERE key = 'schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  EXPECT_ERROR_WITH(Store::open(db()), db().string(), "schema version 99", "version 1");
}

TEST_F(CoordinatorStoreTest, SavingBeforeBindingIsAnError) {
  Store store = Store::open(db());
  EXPECT_ERROR_WITH(store.save(sample_state()), db().string(), "bind");
}

TEST_F(CoordinatorStoreTest, NotADatabaseIsAClearError) {
  {
    std::FILE* f = std::fopen(db().c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string junk(4096, 'j');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  EXPECT_ERROR_WITH(Store::open(db()), db().string());
}

TEST_F(CoordinatorStoreTest, MovedStoresKeepWorking) {
  Store a = Store::open(db());
  Store b = std::move(a);
  b.bind("run-1", "toml");
  b.save(sample_state());
  Store c = Store::open(dir_ / "other.db");
  c = std::move(b);
  EXPECT_TRUE(*c.load() == sample_state());
}

TEST_F(CoordinatorStoreTest, AStateMachinesStateRoundTrips) {
  Options options;
  options.run_id = "run-1";
  options.total_steps = 5;
  options.batch_size = 7;
  options.network.min_peers = 2;
  options.network.overlap = 1;
  std::vector<net::Identity> ids = {net::Identity::generate(), net::Identity::generate()};
  StateMachine sm(options, RunState{});
  const double t = 1'700'000'000.3;
  for (const net::Identity& id : ids) {
    wire::Envelope join;
    join.mutable_join()->set_key(id.public_key());
    join.mutable_join()->set_endpoint("tcp://127.0.0.1:" + std::to_string(9000 + (&id - &ids[0])));
    join.mutable_join()->set_sequences_per_second(1.7);
    sm.handle(id.public_key(), join, t);
  }
  sm.tick(t + 2.5);
  for (const net::Identity& id : ids) {
    wire::Envelope commit;
    wire::CommitRecord* r = commit.mutable_commit()->mutable_record();
    r->set_author(id.public_key());
    r->set_step(0);
    r->set_payload_hash(id.public_key());  // any 32 bytes
    r->set_signature(id.sign(net::commit_signing_bytes("run-1", 0, id.public_key())));
    commit.mutable_commit()->set_sequences(3);
    commit.mutable_commit()->set_compute_seconds(0.7);
    sm.handle(id.public_key(), commit, t + 3.1);
  }
  wire::Envelope witness;
  witness.mutable_witness()->set_step(0);
  witness.mutable_witness()->add_held(ids[1].public_key());
  sm.handle(ids[0].public_key(), witness, t + 3.3);
  sm.handle(ids[1].public_key(), witness, t + 3.3);
  ASSERT_EQ(sm.state().finalized_steps(), 1u);
  ASSERT_TRUE(sm.state().round.has_value());

  Store store = Store::open(db());
  store.bind(options.run_id, "");
  store.save(sm.state());
  EXPECT_TRUE(*Store::open(db()).load() == sm.state());
}

}  // namespace
}  // namespace agora::coord
