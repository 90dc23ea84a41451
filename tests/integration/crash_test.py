#!/usr/bin/env python3
"""Crash consistency, proven by killing real processes at chosen points of the paths that must
survive a crash (docs/protocol.md, "Crash consistency"). One scenario per invocation:

    crash_test.py AGORA DATA_DIR {coordinator|checkpoint} [SEED]

The processes are killed by the fault-injection hook of src/agora/core/crash_point.h: a process
started with AGORA_CRASH_AT="NAME:N" raises SIGKILL on itself the N-th time it passes the crash
point NAME, so each kill lands at a known line (no cleanup runs, exactly like `kill -9`).

coordinator: the coordinator of a 2-peer run is killed 20 times at (point, pass) pairs drawn
  with a seeded RNG among its save path's points (SEED, default 19, or $AGORA_CRASH_SEED), and
  restarted on the same state_db each time, then left to finish. Asserted: every armed process
  died at its point by SIGKILL and none refused its database; each restart resumed with at least
  every step a peer had applied (a peer applies a step only after the coordinator said it is
  final) and at least every step whose row it printed; the step rows are increasing and unique,
  and the authors of each printed row are the final set the database holds for that step (no
  step finalized twice with different sets); the database's ledger is whole and passes SQLite's
  integrity check; both peers finish with the same state hash.

checkpoint: a checkpointer peer is killed at points of its checkpoint writes while it replaces
  the folders an earlier run (another seed, so other parameters) left in its checkpoint folder,
  and restarted each time. Asserted after each kill and at the end: every checkpoint_NNNNNN folder
  present is complete (its files, a safetensors header that accounts for every byte, the step in
  agora.json) and holds the parameters of the earlier run or of this one at step NNNNNN (the
  BLAKE2b state hash recomputed from model.safetensors); an earlier run's checkpoint is never
  lost (it stays, whole, or is aside as checkpoint_NNNNNN.replaced until the next write puts it
  back); `latest` never points at a *.tmp or *.replaced folder and, at the end, at a complete
  checkpoint; no leftover remains at the end; every checkpoint the coordinator recorded hashes
  to the hash the peer reported; agora eval loads `latest`; the three peers finish identical.
"""
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import time

from network_run import Run

# The coordinator's save path (src/agora/core/crash_point.h) and the most passes to wait for: a
# save point is passed once per save (a batch of messages, several a second with two peers), a
# finalization point once per finalized step, mid_send once per extra message of a batch.
COORDINATOR_POINTS = {
    "service.before_save": 12,
    "service.final_unsaved": 3,
    "store.save.begin": 12,
    "store.save.after_begin": 12,
    "store.save.after_state": 12,
    "store.save.after_ledger": 12,
    "store.save.after_members": 12,
    "store.save.after_reports": 12,
    "store.save.before_commit": 12,
    "store.save.after_commit": 12,
    "service.after_save": 12,
    "service.final_saved": 3,
    "service.mid_send": 6,
}
KILLS = 20
SIGKILLED = -signal.SIGKILL


def wait_exit(run, process, what, timeout):
    end = time.time() + timeout
    while process.poll() is None:
        if time.time() > end:
            run.fail(f"timed out after {timeout} s waiting for {what} to die at its crash point")
        time.sleep(0.05)
    return process.returncode


def read_from(path, offset):
    with open(path, errors="replace") as f:
        f.seek(offset)
        return f.read()


def check_killed_at(run, code, log_path, offset, crash_at, what):
    """The process died by SIGKILL at `crash_at` (its "crash point" line in the log after
    `offset`) and logged no error."""
    text = read_from(log_path, offset)
    point, hit = crash_at.split(":")
    if code != SIGKILLED or f"crash point {point} hit {hit}: SIGKILL" not in text:
        run.fail(f"{what} started with AGORA_CRASH_AT={crash_at} exited with {code}, expected "
                 f"to die by SIGKILL at that point; its log:\n{text[-2000:]}")
    errors = [line for line in text.splitlines() if "error:" in line]
    if errors:
        run.fail(f"{what} (AGORA_CRASH_AT={crash_at}) logged errors: {errors[:3]}")


def draw_coordinator_kills(seed):
    """KILLS distinct (point, pass) pairs: every save-path point at least once, the rest drawn."""
    rng = random.Random(seed)
    pairs = [(p, rng.randint(1, most)) for p, most in COORDINATOR_POINTS.items()]
    pool = [(p, n) for p, most in COORDINATOR_POINTS.items() for n in range(1, most + 1)
            if (p, n) not in pairs]
    pairs += rng.sample(pool, KILLS - 1 - len(pairs))
    rng.shuffle(pairs)
    # First of all, once per run: killed before a fresh database is bound to the run.
    return [("store.bind.before_commit", 1)] + pairs


def ledger(db):
    """The coordinator's database: SQLite's integrity check, the finalized steps, and step -> the
    final set's author keys (hex)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        steps = [s for (s,) in con.execute("SELECT step FROM finalized_steps ORDER BY step")]
        sets = {}
        for step, author in con.execute("SELECT step, author FROM ledger ORDER BY step, position"):
            sets.setdefault(step, []).append(author.hex())
        return integrity, steps, sets
    finally:
        con.close()


def max_applied(run, peers):
    """The most finalized steps any of `peers` applied (their "state" events, one per step with
    network.hash_interval = 1)."""
    return max((max(run.states(i), default=0) for i in peers), default=0)


def file_size(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def scenario_coordinator(agora, data, seed):
    kills = draw_coordinator_kills(seed)
    print(f"seed {seed}: kills at {', '.join(f'{p}:{n}' for p, n in kills)}")
    run = Run(agora, data, "crash-coordinator", peers=2, steps=60, sets=["network.min_peers=2"])
    if run.hash_interval != 1:
        run.fail("the scenario reads every applied step from the peers' state reports")
    db = os.path.join(run.dir, "coordinator.db")
    log_path = os.path.join(run.dir, "coordinator.log")
    started = time.time()
    must_hold = None  # what the next process must load as final (None: nothing bound yet)
    lost = set()      # steps saved as final by a process killed before it printed their rows
    resumed_at = []
    for k in range(len(kills) + 1):
        offset = file_size(log_path)
        crash_at = f"{kills[k][0]}:{kills[k][1]}" if k < len(kills) else None
        what = f"the coordinator ({crash_at or 'unarmed'}, start {k + 1})"
        run.start_coordinator(env={"AGORA_CRASH_AT": crash_at} if crash_at else None)
        if crash_at:
            code = wait_exit(run, run.coordinator, what, 60)
            check_killed_at(run, code, log_path, offset, crash_at, what)
        else:
            run.wait_finished(timeout=180)
        if must_hold is not None:
            # It resumed from the database (its start line, logged before it handles anything;
            # a kill may come before its first row), with the steps the file held as final: at
            # least every step a peer applied or whose row was printed.
            start_line = re.search(r"resumed at step (\d+)", read_from(log_path, offset))
            if not start_line:
                run.fail(f"{what} did not resume from its database: "
                         f"{read_from(log_path, offset)[-1500:]}")
            loaded, (applied, printed) = int(start_line.group(1)), must_hold
            if loaded < max(applied, printed):
                run.fail(f"{what} resumed with {loaded} final steps, but a peer had applied "
                         f"{applied} and rows were printed for {printed}: final steps were lost")
            lost |= set(range(printed, loaded))
            resumed_at.append(loaded)
        if k == 0:
            # Killed before the fresh database was bound: nothing to resume; the peers join the
            # run the next process starts.
            if ledger(db)[1]:
                run.fail("a database killed before it was bound holds finalized steps")
            for i in range(2):
                run.start_peer(i)
            continue
        if crash_at:
            # Let the peers take in what the dead process had sent before it died.
            time.sleep(0.3)
            printed = max((r["step"] + 1 for r in run.steps_final()), default=0)
            must_hold = (max_applied(run, range(2)), printed)
    kill_seconds = time.time() - started
    # The rows: increasing, unique, every step but the lost ones; each printed set is the set the
    # database holds for that step, so no step was finalized twice with different sets.
    run.check_all_steps_final(lost=lost)
    integrity, steps, sets = ledger(db)
    if integrity != "ok":
        run.fail(f"the coordinator's database fails SQLite's integrity check: {integrity}")
    if steps != list(range(run.steps)):
        run.fail(f"the database's ledger holds steps {steps}, expected 0..{run.steps - 1}")
    for r in run.steps_final():
        held = sorted(a[:8] for a in sets.get(r["step"], []))
        if sorted(r["authors"]) != held:
            run.fail(f"step {r['step']} was printed final with authors {sorted(r['authors'])} but "
                     f"the database holds {held}")
    run.check_identical(range(2), throughout=range(2))
    run.check_finished(range(2))
    print(f"killed the coordinator {len(kills)} times in {kill_seconds:.0f} s (resumed at final "
          f"steps {resumed_at}); {len(lost)} step rows lost to kills between save and print, no "
          f"step; both peers finished identical")
    run.cleanup()


# ------------------------------------------------------------------------------- checkpoints

# A checkpoint folder's files (src/agora/train/checkpoint.h); training_state.safetensors only in
# `agora train`'s checkpoints.
CHECKPOINT_FILES = ("config.json", "model.safetensors", "agora.json", "run.toml")
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d{6})$")


def state_hash(path):
    """The BLAKE2b-256 state hash of a model.safetensors (docs/protocol.md section 2): the hash of
    the concatenated per-tensor hashes, in the order the tensors are stored (the model's
    parameter order). Checks that the header accounts for every byte; None when it does not."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        return None
    (n,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError:
        return None
    tensors = sorted((v["data_offsets"], k, v) for k, v in header.items() if k != "__metadata__")
    body = raw[8 + n:]
    at = 0
    hashes = b""
    for (begin, end), name, info in tensors:
        count = 1
        for d in info["shape"]:
            count *= d
        if info["dtype"] != "F32" or begin != at or end - begin != 4 * count:
            return None
        hashes += hashlib.blake2b(body[begin:end], digest_size=32).digest()
        at = end
    if at != len(body):
        return None
    return hashlib.blake2b(hashes, digest_size=32).hexdigest()


def checkpoint_problem(path, step):
    """What is wrong with the checkpoint folder `path` of `step`, or None; and its state hash."""
    for name in CHECKPOINT_FILES:
        if not os.path.isfile(os.path.join(path, name)):
            return f"{name} is missing", None
    try:
        with open(os.path.join(path, "agora.json")) as f:
            meta = json.load(f)
        with open(os.path.join(path, "config.json")) as f:
            json.load(f)
    except ValueError as e:
        return f"a JSON file does not parse: {e}", None
    if meta.get("step") != step:
        return f"agora.json says step {meta.get('step')}", None
    if meta.get("tokenizer") == "tokenizer.model" and \
            not os.path.getsize(os.path.join(path, "tokenizer.model")):
        return "tokenizer.model is empty", None
    h = state_hash(os.path.join(path, "model.safetensors"))
    if h is None:
        return "model.safetensors is malformed or cut short", None
    return None, h


def consensus(run, peers):
    """applied steps -> the state hash the peers reported (they agree: check_identical)."""
    out = {}
    for i in peers:
        out.update(run.states(i))
    return out


def check_checkpoint_folder(run, root, old, new, when, final=False):
    """Every checkpoint in `root` is complete and holds the old run's or this run's parameters at
    its step; every checkpoint of the old run is still there, or aside whole; latest names a
    checkpoint. `old`: step -> hash of the earlier run's checkpoints; `new`: this run's hashes
    (from the peers' reports, read now). Returns step -> "old" or "new"."""
    names = sorted(os.listdir(root))
    kinds = {}
    for name in names:
        m = CHECKPOINT_NAME.match(name)
        if not m:
            continue
        step = int(m.group(1))
        problem, h = checkpoint_problem(os.path.join(root, name), step)
        if problem:
            run.fail(f"{when}: {root}/{name} is not a whole checkpoint: {problem}")
        if h == old.get(step):
            kinds[step] = "old"
        elif h == new.get(step):
            kinds[step] = "new"
        else:
            run.fail(f"{when}: {root}/{name} holds state {h[:16]}, neither the earlier run's "
                     f"({(old.get(step) or '-')[:16]}) nor this run's ({(new.get(step) or '-')[:16]}) "
                     f"after {step} steps")
    for step in old:
        name = f"checkpoint_{step:06}"
        if step in kinds:
            continue
        aside = os.path.join(root, name + ".replaced")
        problem, h = checkpoint_problem(aside, step) if os.path.isdir(aside) else ("absent", None)
        if final or problem or h != old[step]:
            run.fail(f"{when}: the earlier run's {name} is gone"
                     + ("" if final else f" and {name}.replaced does not hold it whole ({problem})"))
    latest = os.path.join(root, "latest")
    if os.path.lexists(latest):
        target = os.readlink(latest)
        if not CHECKPOINT_NAME.match(target):
            run.fail(f"{when}: latest points at {target}, not a checkpoint_NNNNNN folder")
        if final and int(target[len("checkpoint_"):]) not in kinds:
            run.fail(f"{when}: latest points at {target}, which is not a whole checkpoint")
    if final:
        leftovers = [n for n in names if not CHECKPOINT_NAME.match(n) and n != "latest"]
        if leftovers:
            run.fail(f"{when}: leftovers in {root}: {leftovers}")
    return kinds


# The checkpointer's kills, in order: each process dies at the first pass of its point.
#   after_aside    replacing the earlier run's checkpoint_000002: it is aside, the new one in tmp
#   after_weights  the tmp folder half written
#   file.before_rename:3  the third file of the tmp folder fsynced, not renamed
#   after_rename   the new folder in place, the parent not fsynced, the old one still aside
#   symlink.before_rename  the checkpoint whole, latest not yet moved to it
CHECKPOINT_KILLS = ["checkpoint.after_aside:1", "checkpoint.after_weights:1",
                    "file.before_rename:3", "checkpoint.after_rename:1",
                    "symlink.before_rename:1"]


def scenario_checkpoint(agora, data, seed):
    interval = 2
    sets = ["network.min_peers=2", "network.checkpointers=1",
            f"train.checkpoint_interval={interval}"]
    # The earlier run: another seed, so other parameters, leaves checkpoint_000002..8 and latest.
    earlier = Run(agora, data, "crash-earlier", peers=2, steps=4 * interval,
                  sets=sets + ["seed=100"])
    earlier.start_coordinator()
    earlier.start_peer(0)
    earlier.wait_until("peer 0 to join", lambda: earlier.events(0, "joined"), 60)
    earlier.start_peer(1)
    earlier.wait_finished()
    if not earlier.events(0, "joined")[0]["checkpointer"]:
        earlier.fail("the first peer to join was not made the checkpointer")
    old_states = consensus(earlier, range(2))
    old = {step: old_states[step] for step in range(interval, earlier.steps + 1, interval)}

    # Long enough that the run is still going when the last kill comes (about step 50 here).
    run = Run(agora, data, "crash-checkpoint", peers=3, steps=100, sets=sets)
    root = os.path.join(run.dir, "ckpt-0")
    shutil.copytree(os.path.join(earlier.dir, "ckpt-0"), root, symlinks=True)
    earlier.cleanup()
    kinds = check_checkpoint_folder(run, root, old, {}, "the earlier run's folder")
    if sorted(kinds) != sorted(old) or set(kinds.values()) != {"old"}:
        run.fail(f"the earlier run left checkpoints {kinds}, expected {sorted(old)}")

    run.start_coordinator()
    log_path = os.path.join(run.dir, "peer-0.log")
    started = time.time()
    for k, crash_at in enumerate(CHECKPOINT_KILLS):
        offset = file_size(log_path)
        run.start_peer(0, env={"AGORA_CRASH_AT": crash_at})
        if k == 0:
            run.wait_until("peer 0 to join", lambda: run.events(0, "joined"), 60)
            if not run.events(0, "joined")[0]["checkpointer"]:
                run.fail("the first peer to join was not made the checkpointer")
            for i in (1, 2):
                run.start_peer(i)
        what = f"the checkpointer (kill {k + 1})"
        code = wait_exit(run, run.peers[0], what, 90)
        check_killed_at(run, code, log_path, offset, crash_at, what)
        del run.peers[0]
        when = f"after {what} at {crash_at}"
        kinds = check_checkpoint_folder(run, root, old, consensus(run, range(3)), when)
        if k == 0 and (2 in kinds or not os.path.isdir(os.path.join(root,
                                                                    "checkpoint_000002.replaced"))):
            run.fail(f"{when}: expected checkpoint_000002 aside as checkpoint_000002.replaced "
                     f"(the kill is between moving it aside and renaming the new one in)")
        print(f"{when}: whole checkpoints {kinds}; "
              f"leftovers {[n for n in sorted(os.listdir(root)) if '.' in n]}")
    run.start_peer(0)
    run.wait_finished(timeout=180)
    kill_seconds = time.time() - started
    run.check_all_steps_final()
    run.check_identical(range(3), throughout=[1, 2])
    run.check_finished(range(3))
    new = consensus(run, range(3))
    kinds = check_checkpoint_folder(run, root, old, new, "at the end", final=True)
    # Every checkpoint the coordinator recorded is in place and hashes to the reported hash.
    con = sqlite3.connect(f"file:{run.dir}/coordinator.db?mode=ro", uri=True)
    recorded = con.execute("SELECT applied_steps, state_hash, path FROM checkpoints").fetchall()
    con.close()
    if not recorded:
        run.fail("the coordinator recorded no checkpoint report")
    for step, h, path in recorded:
        problem, found = checkpoint_problem(path, step) if os.path.isdir(path) else ("absent", None)
        if problem or found != h.hex():
            run.fail(f"the coordinator recorded checkpoint {path} after {step} steps with state "
                     f"{h.hex()[:16]}, but the folder is {problem or found[:16]}")
    # agora loads the checkpoint latest points at.
    latest = os.path.join(root, "latest")
    out = subprocess.run([agora, "eval", "--checkpoint", latest, "--data",
                          os.path.join(data, "val_000000.bin"), "--max-windows", "2", "--json"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        run.fail(f"agora eval could not load {latest}: {out.stderr[-1000:]}")
    print(f"killed the checkpointer {len(CHECKPOINT_KILLS)} times in {kill_seconds:.0f} s; "
          f"checkpoints at the end {kinds} (old: the earlier run's, kept), "
          f"{len(recorded)} recorded reports match their folders, latest -> "
          f"{os.readlink(latest)} loads")
    run.cleanup()


SCENARIOS = {"coordinator": scenario_coordinator, "checkpoint": scenario_checkpoint}

if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[3] not in SCENARIOS:
        sys.exit(f"usage: crash_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}} [SEED]")
    seed = int(sys.argv[4]) if len(sys.argv) == 5 else int(os.environ.get("AGORA_CRASH_SEED", 19))
    try:
        SCENARIOS[sys.argv[3]](sys.argv[1], sys.argv[2], seed)
    except Exception:  # a log without a field the test reads, ...: a failure, processes stopped
        import traceback
        traceback.print_exc()
        for r in Run.started:
            r.stop()
        if Run.started and os.path.isdir(Run.started[-1].dir):
            Run.started[-1].fail("the test crashed (above)")
        sys.exit(1)
