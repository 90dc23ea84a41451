// Crash points: a deliberate fault-injection hook, so tests can kill a process at a chosen line
// of a path that must survive a crash (the coordinator's save, a checkpoint's write) and then
// check what a restart finds. Nothing else uses it.
//
// crash_point("store.save.after_begin") does nothing unless the environment variable
// AGORA_CRASH_AT names that point: AGORA_CRASH_AT="NAME" or "NAME:N" kills the process at the
// N-th time (default 1, counted from process start) execution passes NAME. The process writes
// one line to stderr ("crash point NAME hit N: SIGKILL") and raises SIGKILL on itself: no
// destructor, atexit handler, buffered stdout or SQLite rollback runs, exactly as if an operator
// had sent `kill -9` at that instant (the kernel still holds what was written, as after a kill;
// a power cut would lose more, which the fsyncs are for).
//
// Promises:
//   - unset (the normal case) it costs one test of a flag read once per process;
//   - an AGORA_CRASH_AT that is not "NAME[:N]" with NAME one of the points below and N >= 1 is
//     an Error naming the value and the allowed form, from check_crash_at() (agora's main calls
//     it at start) or else from the first crash_point() reached; a misspelt point never lets a
//     test pass silently by not crashing.
//
// The points (kCrashPoints in crash_point.cc; a point must be listed there to be named):
//
// The coordinator's save path (coord/store.cc, coord/service.cc), hit once per save unless said:
//   service.before_save     a batch changed the state in memory; nothing of it saved or sent
//   service.final_unsaved   the same, for a batch that made new steps final (hit only then):
//                           no peer may have heard of them
//   store.save.begin        Store::save entered, before BEGIN
//   store.save.after_begin  the write transaction is open, nothing written
//   store.save.after_state  the `run` row (phase, open round, queue) written
//   store.save.after_ledger the new finalized steps, their ledger rows and step rows written
//   store.save.after_members the members table rewritten
//   store.save.after_reports the state reports and records rewritten
//   store.save.before_commit everything written (checkpoints, events), COMMIT not run
//   store.save.after_commit COMMIT returned (on disk: synchronous=FULL)
//   service.after_save      saved; nothing logged or sent yet
//   service.final_saved     a save that made new steps final returned; their rows are not
//                           printed and their Finalized messages not sent (hit only then)
//   service.mid_send        between two messages of one batch: some went out, the rest not
//                           (hit before each message but the first)
//   store.bind.before_commit a fresh file's run id written, not committed (once per run)
//
// A checkpoint's write (train/checkpoint.cc), hit once per checkpoint unless said:
//   checkpoint.begin        nothing written yet (stale folders already swept)
//   checkpoint.after_weights DIR.tmp holds config.json and model.safetensors only
//   checkpoint.after_tmp    DIR.tmp complete, every file fsynced; DIR untouched
//   checkpoint.after_aside  the old DIR renamed to DIR.replaced (hit only when DIR existed)
//   checkpoint.after_rename DIR.tmp renamed to DIR, the folder not yet fsynced
//   checkpoint.after_sync   the folder fsynced; DIR.replaced not yet removed
//
// Every atomic file and symlink replacement (core/file.cc), in any process:
//   file.before_rename      AtomicFile::commit: the temporary fsynced, not renamed
//   file.after_rename       renamed over the target, its folder not yet fsynced
//   symlink.before_rename   replace_symlink: the temporary link made, not renamed
//   symlink.after_rename    renamed over the link, its folder not yet fsynced
//
// A pipeline stage process (peer/stage_process.cc, pipeline/stage_checkpoint.cc):
//   stage.after_step        one iteration of the schedule done (and its checkpoint, if due)
//   stage.checkpoint.after_state  a stage checkpoint's state file written, its parameters not
//
// The asynchronous outer server's save (async/outer_durable.cc, async/outer_store.cc), hit once
// per save:
//   async_server.before_save      a pass changed what must be kept; nothing of it saved or sent
//   async_store.tensors_written   the new tensor file written, the save naming it not committed
//   async_server.after_save       saved; the pass's answers not sent yet
//
// The swarm coordinator's save (swarm/coordinator_server.cc), hit once per save:
//   swarm_server.after_save       saved; the batch's answers not sent yet
//
// The pass count is atomic: passes from several threads are each counted once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace agora {

// What AGORA_CRASH_AT asks for.
struct CrashAt {
  std::string point;
  uint64_t hit = 1;  // the N-th pass kills
  bool operator==(const CrashAt&) const = default;
};

// Parses "NAME" or "NAME:N". Throws Error naming `text` and the allowed form when it is empty,
// N is not a whole number >= 1, or NAME is not a known point.
CrashAt parse_crash_at(std::string_view text);

// Every point that may be named, in the order of the list above.
std::span<const std::string_view> crash_points();

// Reads AGORA_CRASH_AT once (later calls see the first reading) and throws Error when it is set
// but malformed. Call early in main, so a bad value stops the process before it does anything.
void check_crash_at();

// Kills this process with SIGKILL when AGORA_CRASH_AT names `point` and this is its N-th pass;
// otherwise returns at once. `point` must be one of crash_points() (checked only when armed).
void crash_point(std::string_view point);

}  // namespace agora
