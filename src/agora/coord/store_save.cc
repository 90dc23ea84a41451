// Store::save: one transaction that writes what changed since this process's previous save
// (store.h, "What a save writes").
#include <nlohmann/json.hpp>

#include "agora/coord/run_state_json.h"
#include "agora/coord/store.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/serve/sqlite.h"

namespace agora::coord {
namespace {

using nlohmann::json;
using serve::Statement;
using serve::Transaction;

bool same_header(const OpenRound& a, const OpenRound& b) {
  return a.step == b.step && a.apply_through == b.apply_through &&
         a.report_state == b.report_state && a.opened_at == b.opened_at &&
         a.deadline == b.deadline && a.assignments == b.assignments;
}

bool same_header(const CollectingStep& a, const CollectingStep& b) {
  return a.step == b.step && a.commits == b.commits && a.ranges == b.ranges &&
         a.expected == b.expected && a.deadline == b.deadline;
}

// The step with its witnesses' keys but not their holdings, which are rows written once per
// witness and never change: the copy a save keeps stays O(members) per step, not O(members^2).
CollectingStep without_holders(const CollectingStep& c) {
  CollectingStep out;
  out.step = c.step;
  out.commits = c.commits;
  out.ranges = c.ranges;
  out.expected = c.expected;
  for (const auto& [key, bits] : c.witnessed) out.witnessed[key];
  out.deadline = c.deadline;
  return out;
}

}  // namespace

void Store::save(const RunState& s, bool allow_rollback, const std::vector<StepRow>& rows) {
  if (!run()) {
    fail("coordinator database {}: bind it to a run before saving a state", path_.string());
  }
  // The crash points (core/crash_point.h) let tests kill the process between any two parts of
  // the transaction: a restart must find the previous state or this one, whole.
  crash_point("store.save.begin");
  Transaction transaction(db_, path_, "BEGIN IMMEDIATE");
  crash_point("store.save.after_begin");
  {
    Statement put(db_, path_, "INSERT OR REPLACE INTO run (key, value) VALUES ('state', ?)");
    put.bind_text(1, core_json(s).dump()).run();
  }
  save_in_flight(s);
  crash_point("store.save.after_state");
  save_ledger(s, allow_rollback);
  crash_point("store.save.after_ledger");
  save_members(s);
  crash_point("store.save.after_members");
  save_reports(s);
  crash_point("store.save.after_reports");
  save_checkpoints_and_events(s, rows);
  crash_point("store.save.before_commit");
  transaction.commit();
  crash_point("store.save.after_commit");
  // Only a committed transaction is what the file holds: a save that threw leaves the previous
  // record (and the rolled-back file) as they were.
  Saved saved;
  saved.round = s.round;
  for (const auto& [t, c] : s.collecting) saved.collecting.emplace(t, without_holders(c));
  saved.members = s.members;
  saved.reports = s.state_reports;
  saved.checkpoints = s.checkpoints;
  saved_ = std::move(saved);
}

void Store::save_in_flight(const RunState& s) {
  const bool all = !saved_.has_value();
  // The open round: its header when it changed, its commits one row each.
  const bool same_round = !all && s.round.has_value() == saved_->round.has_value() &&
                          (!s.round || same_header(*s.round, *saved_->round));
  if (!same_round) {
    Statement put(db_, path_, "INSERT OR REPLACE INTO run (key, value) VALUES ('round', ?)");
    put.bind_text(1, s.round ? round_header_json(*s.round).dump() : "null").run();
  }
  Statement put_commit(db_, path_,
                       "INSERT OR REPLACE INTO round_commits (author, step, payload_hash, "
                       "signature) VALUES (?, ?, ?, ?)");
  const auto write_commit = [&](const CommitRecord& c) {
    put_commit.bind_blob(1, c.author)
        .bind(2, c.step)
        .bind_blob(3, c.payload_hash)
        .bind_blob(4, c.signature)
        .run();
  };
  const bool same_step = !all && s.round && saved_->round && s.round->step == saved_->round->step;
  if (!same_step) {
    exec("DELETE FROM round_commits");
    if (s.round) {
      for (const auto& [author, c] : s.round->commits) write_commit(c);
    }
  } else {
    const auto& before = saved_->round->commits;
    for (const auto& [author, c] : s.round->commits) {
      auto it = before.find(author);
      if (it == before.end() || !(it->second == c)) write_commit(c);
    }
    Statement erase(db_, path_, "DELETE FROM round_commits WHERE author = ?");
    for (const auto& [author, c] : before) {
      if (!s.round->commits.contains(author)) erase.bind_blob(1, author).run();
    }
  }

  // The collecting steps: their headers when any changed, each witness's holdings once.
  bool same_steps = !all && s.collecting.size() == saved_->collecting.size();
  for (auto a = s.collecting.begin(); same_steps && a != s.collecting.end(); ++a) {
    auto b = saved_->collecting.find(a->first);
    same_steps = b != saved_->collecting.end() && same_header(a->second, b->second);
  }
  if (!same_steps) {
    json steps = json::array();
    for (const auto& [t, c] : s.collecting) steps.push_back(collecting_header_json(c));
    Statement put(db_, path_, "INSERT OR REPLACE INTO run (key, value) VALUES ('collecting', ?)");
    put.bind_text(1, steps.dump()).run();
  }
  Statement put_held(db_, path_,
                     "INSERT OR REPLACE INTO witness_holdings (step, witness, held) "
                     "VALUES (?, ?, ?)");
  Statement erase_step(db_, path_, "DELETE FROM witness_holdings WHERE step = ?");
  if (all) exec("DELETE FROM witness_holdings");
  if (!all) {
    for (const auto& [t, c] : saved_->collecting) {
      auto now = s.collecting.find(t);
      if (now == s.collecting.end() || !same_header(now->second, c)) erase_step.bind(1, t).run();
    }
  }
  for (const auto& [t, c] : s.collecting) {
    const CollectingStep* before = nullptr;
    if (!all) {
      auto it = saved_->collecting.find(t);
      if (it != saved_->collecting.end() && same_header(it->second, c)) before = &it->second;
    }
    for (const auto& [witness, held] : c.witnessed) {
      if (before != nullptr && before->witnessed.contains(witness)) continue;
      put_held.bind(1, t).bind_blob(2, witness).bind_blob(3, held).run();
    }
  }
}

void Store::save_ledger(const RunState& s, bool allow_rollback) {
  // The ledger only grows: insert the steps the file does not hold yet.
  Statement count(db_, path_, "SELECT COUNT(*) FROM finalized_steps");
  count.step();
  const uint64_t on_disk = count.uint64(0);
  if (on_disk > s.finalized.size() && allow_rollback) {
    // The run went back to a checkpoint (every member had left): the undone steps go.
    Statement drop_steps(db_, path_, "DELETE FROM finalized_steps WHERE step >= ?");
    drop_steps.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
    Statement drop_rows(db_, path_, "DELETE FROM ledger WHERE step >= ?");
    drop_rows.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
    Statement drop_stats(db_, path_, "DELETE FROM step_stats WHERE step >= ?");
    drop_stats.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
  } else if (on_disk > s.finalized.size()) {
    fail(
        "coordinator database {} holds {} finalized steps but the state to save has {}: "
        "the ledger never shrinks (is this the state of another run?)",
        path_.string(), on_disk, s.finalized.size());
  }
  Statement step(db_, path_, "INSERT INTO finalized_steps (step, payloads) VALUES (?, ?)");
  Statement row(db_, path_,
                "INSERT INTO ledger (step, position, author, payload_hash, signature) "
                "VALUES (?, ?, ?, ?, ?)");
  for (uint64_t t = std::min<uint64_t>(on_disk, s.finalized.size()); t < s.finalized.size(); ++t) {
    step.bind(1, t).bind(2, static_cast<int64_t>(s.finalized[t].size())).run();
    for (size_t i = 0; i < s.finalized[t].size(); ++i) {
      const CommitRecord& c = s.finalized[t][i];
      row.bind(1, t)
          .bind(2, static_cast<int64_t>(i))
          .bind_blob(3, c.author)
          .bind_blob(4, c.payload_hash)
          .bind_blob(5, c.signature)
          .run();
    }
  }
}

void Store::save_members(const RunState& s) {
  Statement row(db_, path_,
                "INSERT OR REPLACE INTO members (key, endpoint, agent, state, drop_reason, "
                "strikes, sequences_per_second, last_seen, applied_steps, checkpointer, "
                "joined_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  const auto write = [&](const PublicKey& key, const MemberRecord& m) {
    row.bind_blob(1, key)
        .bind_text(2, m.endpoint)
        .bind_text(3, m.agent)
        .bind(4, static_cast<int64_t>(m.state))
        .bind(5, static_cast<int64_t>(m.drop_reason))
        .bind(6, m.strikes)
        .bind(7, m.sequences_per_second)
        .bind(8, m.last_seen)
        .bind(9, m.applied_steps)
        .bind(10, static_cast<int64_t>(m.checkpointer ? 1 : 0))
        .bind(11, m.joined_at)
        .run();
  };
  if (!saved_) {
    exec("DELETE FROM members");
    for (const auto& [key, m] : s.members) write(key, m);
    return;
  }
  // A row is written when anything but last_seen changed. A heartbeat (one per member per
  // second) moves last_seen alone, and rewriting the row for each was 18% of the SQLite bytes
  // at 1000 members (docs/scaling.md). Nothing is lost: resume() sees every current member
  // "now", and a departed member's row keeps the time of its departure.
  const auto& before = saved_->members;
  for (const auto& [key, m] : s.members) {
    auto it = before.find(key);
    if (it == before.end()) {
      write(key, m);
      continue;
    }
    MemberRecord seen_then = m;
    seen_then.last_seen = it->second.last_seen;
    if (!(seen_then == it->second)) write(key, m);
  }
  Statement erase(db_, path_, "DELETE FROM members WHERE key = ?");
  for (const auto& [key, m] : before) {
    if (!s.members.contains(key)) erase.bind_blob(1, key).run();
  }
}

void Store::save_reports(const RunState& s) {
  Statement report(db_, path_,
                   "INSERT OR REPLACE INTO state_reports (applied_steps, reporter, state_hash, "
                   "resync_sent) VALUES (?, ?, ?, ?)");
  Statement record(db_, path_,
                   "INSERT OR REPLACE INTO state_records (applied_steps, state_hash, "
                   "tensor_names, tensor_hashes) VALUES (?, ?, ?, ?)");
  Statement erase_report(db_, path_,
                         "DELETE FROM state_reports WHERE applied_steps = ? AND reporter = ?");
  Statement erase_record(db_, path_,
                         "DELETE FROM state_records WHERE applied_steps = ? AND state_hash = ?");
  const HashReports none;
  if (!saved_) {
    exec("DELETE FROM state_reports");
    exec("DELETE FROM state_records");
  }
  for (const auto& [k, r] : s.state_reports) {
    for (const PublicKey& key : r.resynced) {
      if (!r.reported.contains(key)) {
        fail("coordinator database {}: member {} was resynced for step {} without a report",
             path_.string(), hex_encode(key), k);
      }
    }
    const HashReports* before = &none;
    if (saved_) {
      auto it = saved_->reports.find(k);
      if (it != saved_->reports.end()) before = &it->second;
    }
    if (before->reported == r.reported && before->resynced == r.resynced &&
        before->records == r.records) {
      continue;
    }
    for (const auto& [key, hash] : r.reported) {
      auto was = before->reported.find(key);
      const bool resynced = r.resynced.contains(key);
      if (was != before->reported.end() && was->second == hash &&
          before->resynced.contains(key) == resynced) {
        continue;
      }
      report.bind(1, k).bind_blob(2, key).bind_blob(3, hash).bind(4, int64_t{resynced}).run();
    }
    for (const auto& [key, hash] : before->reported) {
      if (!r.reported.contains(key)) erase_report.bind(1, k).bind_blob(2, key).run();
    }
    for (const auto& [hash, rec] : r.records) {
      auto was = before->records.find(hash);
      if (was != before->records.end() && was->second == rec) continue;
      json hashes = json::array();
      for (const std::string& h : rec.tensor_hashes) hashes.push_back(hex_encode(h));
      record.bind(1, k)
          .bind_blob(2, hash)
          .bind_text(3, json(rec.tensor_names).dump())
          .bind_text(4, hashes.dump())
          .run();
    }
    for (const auto& [hash, rec] : before->records) {
      if (!r.records.contains(hash)) erase_record.bind(1, k).bind_blob(2, hash).run();
    }
  }
  if (saved_) {
    Statement reports_gone(db_, path_, "DELETE FROM state_reports WHERE applied_steps = ?");
    Statement records_gone(db_, path_, "DELETE FROM state_records WHERE applied_steps = ?");
    for (const auto& [k, r] : saved_->reports) {
      if (s.state_reports.contains(k)) continue;
      reports_gone.bind(1, k).run();
      records_gone.bind(1, k).run();
    }
  }
}

void Store::save_checkpoints_and_events(const RunState& s, const std::vector<StepRow>& rows) {
  {
    Statement put(db_, path_,
                  "INSERT OR REPLACE INTO step_stats (step, at, loss, val_loss, learning_rate, "
                  "tokens_per_second, payload_bytes, allreduce_bytes, peers, sequences, "
                  "seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const StepRow& r : rows) {
      put.bind(1, r.step)
          .bind(2, r.at)
          .bind_real(3, r.loss)
          .bind_real(4, r.val_loss)
          .bind_real(5, r.learning_rate)
          .bind_real(6, r.tokens_per_second)
          .bind_real(7, r.payload_bytes)
          .bind_real(8, r.allreduce_bytes)
          .bind(9, r.peers)
          .bind(10, r.sequences)
          .bind_real(11, r.seconds)
          .run();
    }
  }
  if (!saved_ || saved_->checkpoints != s.checkpoints) {
    exec("DELETE FROM checkpoints");
    Statement row(db_, path_,
                  "INSERT INTO checkpoints (position, applied_steps, state_hash, path, "
                  "reporter, at) VALUES (?, ?, ?, ?, ?, ?)");
    for (size_t i = 0; i < s.checkpoints.size(); ++i) {
      const CheckpointRecord& c = s.checkpoints[i];
      row.bind(1, static_cast<int64_t>(i))
          .bind(2, c.applied_steps)
          .bind_blob(3, c.state_hash)
          .bind_text(4, c.path)
          .bind_blob(5, c.reporter)
          .bind(6, c.at)
          .run();
    }
  }
  // Events are history: append the ones newer than the file's newest.
  Statement newest(db_, path_, "SELECT COALESCE(MAX(seq), 0) FROM events");
  newest.step();
  const uint64_t last = newest.uint64(0);
  Statement row(db_, path_, "INSERT INTO events (seq, at, text, kind) VALUES (?, ?, ?, ?)");
  for (const Event& e : s.events) {
    if (e.seq > last) {
      row.bind(1, e.seq).bind(2, e.at).bind_text(3, e.text).bind_text(4, to_string(e.kind)).run();
    }
  }
}

}  // namespace agora::coord
