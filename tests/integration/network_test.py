#!/usr/bin/env python3
"""Decentralized runs with real processes on loopback: one scenario per invocation.

    network_test.py AGORA DATA_DIR SCENARIO [AGORA_ADVERSARY]

(tamper needs AGORA_ADVERSARY, the test-only tests/adversary/agora_adversary.)

Each scenario starts `agora coordinator` and several `agora peer` processes (CURVE over
ZeroMQ, an allowlist, SQLite), does something to them (kill, add, slow, tamper, restart), and
asserts on what the processes record as data, not on their sentences:

- the coordinator's `--json` rows on stdout: {"event": "step", "step", "authors", "sequences",
  "loss", ...} per finalized step and {"event": "log", "text", "step", "peer"} per event
  (src/agora/coord/service.cc);
- each peer's `--log-format json` lines on stderr, whose "event" key names what happened
  ("joined", "state", "trained", "checkpoint", "state_loaded", "finished", "summary", ...) with
  its figures as keys of their own (src/agora/peer/peer.cc); lines that are not JSON (libtorch
  warnings, the closing summary on stdout) are skipped.

Every bound is derived from the run the scenario launches (tests/integration/network.toml plus
the scenario's --set overrides, read into Run.config), with a comment saying why it holds.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from adversary_run import AdversaryRun
from network_run import Run, multiples


def scenario_train(agora, data):
    """Three peers train; the loss falls; after every finalized step all hashes are equal."""
    run = Run(agora, data, "train", peers=3, steps=25, sets=["network.min_peers=3"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_finished()
    run.check_loss_falls()
    run.check_all_steps_final()
    steps = run.check_identical(range(3), throughout=range(3))
    run.check_finished(range(3))
    # min_peers = 3: no round opens before all three are active, and none leaves, so every round
    # splits the whole global batch among the three, and each trains its share.
    by_round = run.sequences_by_round(range(3))
    wrong = {r: n for r, n in by_round.items() if n != run.batch_size}
    if sorted(by_round) != list(range(run.steps)) or wrong:
        run.fail(f"rounds trained {sorted(by_round)}, expected 0..{run.steps - 1}, each with "
                 f"train.batch_size = {run.batch_size} sequences in all; off: {wrong}")
    # The first network.checkpointers joiners are asked to write checkpoints; each writes one
    # when the run finishes (train.checkpoint_interval = 0), after all train.steps steps.
    checkpointers = [i for i in range(3) if run.events(i, "joined")[0]["checkpointer"]]
    if len(checkpointers) != min(3, int(run.cfg("network.checkpointers"))):
        run.fail(f"checkpointers {checkpointers}, expected network.checkpointers = "
                 f"{run.cfg('network.checkpointers')}")
    for i in range(3):
        written = [e["applied_steps"] for e in run.events(i, "checkpoint")]
        expected = [run.steps] if i in checkpointers else []
        if written != expected:
            run.fail(f"peer {i} wrote checkpoints after {written} steps, expected {expected}")
        if written:
            path = run.events(i, "checkpoint")[-1]["path"]
            latest = os.path.join(run.dir, f"ckpt-{i}", "latest")
            if not os.path.isdir(path) or os.path.realpath(latest) != os.path.realpath(path):
                run.fail(f"peer {i}'s checkpoint {path} is missing or not what {latest} points at")
    print(f"identical parameters on all 3 peers after each of {len(steps)} applied-step counts; "
          f"each round trained {run.batch_size} sequences; checkpointer(s) {checkpointers}")
    run.cleanup()


def scenario_kill_peer(agora, data):
    """A peer killed with SIGKILL mid-round does not stall the run; others train its ranges."""
    run = Run(agora, data, "kill", peers=3, steps=24, sets=["network.min_peers=2"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_final(6)
    run.kill_peer(2)
    run.wait_finished()
    run.check_all_steps_final()
    killed = run.short(2)
    drops = run.log_rows("drop", killed)
    if len(drops) != 1:
        run.fail(f"the killed peer {killed} was dropped {len(drops)} times, expected once")
    # A killed process goes silent: it is dropped for that, not for strikes.
    if drops[0].get("reason") != "heartbeat_timeout":
        run.fail(f"the killed peer was dropped for {drops[0].get('reason')!r}, expected "
                 f"'heartbeat_timeout'")
    last_round = max(run.trained(2), default=-1)
    late = [r["step"] for r in run.steps_final() if r["step"] > last_round and killed in r["authors"]]
    if late:
        run.fail(f"steps {late} hold a payload of the killed peer, which trained only up to "
                 f"round {last_round}")
    # While it was a member, the three shared each round's batch; once it was dropped, the two
    # survivors are the only active members and split the whole batch between them. A round t
    # opens only when t <= finalized steps + network.overlap, so the rounds after
    # (finalized steps at the drop) + overlap opened without it.
    by_round = run.sequences_by_round([0, 1])
    with_all = run.sequences_by_round([0, 1, 2])
    without = range(drops[0]["step"] + int(run.cfg("network.overlap")) + 1, run.steps)
    if not without:
        run.fail("the run ended before a round opened without the killed peer")
    for r in without:
        if by_round.get(r) != run.batch_size:
            run.fail(f"round {r} opened after the drop, but the survivors trained "
                     f"{by_round.get(r)} sequences in it, not all {run.batch_size}")
    for r in run.trained(2):
        if with_all.get(r) != run.batch_size:
            run.fail(f"round {r}, shared by three: {with_all.get(r)} sequences, expected "
                     f"{run.batch_size}")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print(f"run finished without the killed peer (dropped at {drops[0]['step']} final steps); "
          f"the survivors trained all {run.batch_size} sequences of rounds "
          f"{without.start}..{without.stop - 1}")
    run.cleanup()


def scenario_restart_peer(agora, data):
    """A peer killed with SIGKILL and started again with the same key rejoins and catches up."""
    run = Run(agora, data, "rejoin", peers=3, steps=40, sets=["network.min_peers=2"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_final(8)
    run.kill_peer(2)
    killed_at = max(run.states(2))
    time.sleep(1)
    run.start_peer(2)  # same key, same log (appended)
    run.wait_finished()
    run.check_all_steps_final()
    lives = run.incarnations(2)
    joins = [e for e in run.events(2, "joined")]
    if len(lives) != 2 or len(joins) != 2 or joins[0]["run"] != joins[1]["run"]:
        run.fail(f"the restarted peer joined {len(joins)} times "
                 f"(runs {[j['run'] for j in joins]}), expected twice the same run")
    if len(run.log_rows("join", run.short(2))) != 2:
        run.fail("the coordinator did not record the restarted peer joining again")
    # The second process had the run's newest state from the members and went on to the end.
    loaded = [e for e in lives[1] if e["event"] == "state_loaded"]
    if not loaded or loaded[0]["source"] != "members" or loaded[0]["applied_steps"] < killed_at:
        run.fail(f"the restarted peer loaded {loaded[:1]}, expected the members' state after at "
                 f"least {killed_at} steps (what it held when killed)")
    if not run.trained(2, lives[1]):
        run.fail("the restarted peer never trained a round after rejoining")
    # Killed between training a round and applying the step before it, it may have reported no
    # state for the counts between where it was killed and what it loaded; from there it
    # reported every hash_interval-th count to the end.
    after = set(run.states(2, lives[1]))
    gaps = multiples(run.hash_interval, loaded[0]["applied_steps"], run.steps) - after
    if gaps:
        run.fail(f"the restarted peer reported no state after {sorted(gaps)} applied steps")
    run.check_identical(range(3), throughout=[0, 1])
    run.check_finished(range(3))
    print(f"killed after step {killed_at}, rejoined with the same key, loaded the state after "
          f"{loaded[0]['applied_steps']} steps and matched the majority to the end")
    run.cleanup()


def scenario_all_leave(agora, data):
    """Every peer dies: restarted, the run goes back to its newest checkpoint and finishes."""
    run = Run(agora, data, "all-leave", peers=2, steps=30,
              sets=["network.min_peers=2", "network.checkpointers=2",
                    "train.checkpoint_interval=10"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    waited = 14
    run.wait_final(waited)
    for i in (0, 1):
        run.kill_peer(i)
    run.wait_until("both peers to be dropped",
                   lambda: all(run.log_rows("drop", run.short(i)) for i in (0, 1)), 30)
    rows_before = len(run.rows())
    # The newest checkpoint written before the kill: each checkpointer writes one every
    # train.checkpoint_interval applied steps.
    interval = int(run.cfg("train.checkpoint_interval"))
    written = [e["applied_steps"] for i in (0, 1) for e in run.events(i, "checkpoint")]
    if not written or any(n % interval for n in written):
        run.fail(f"checkpoints written after {written} steps, expected multiples of {interval}")
    back_to = max(written)
    run.start_peer(0)
    run.start_peer(1)
    run.wait_finished()
    # Before the kill the run went 0, 1, ... (steps still collecting may finalize after it,
    # empty); after going back to the checkpoint, its rows continue from the checkpoint's step to
    # the end.
    rows = run.rows()
    restart = [n for n, r in enumerate(rows) if r.get("event") == "log" and
               r.get("kind") == "restart"]
    if len(restart) != 1 or restart[0] < rows_before:
        run.fail(f"the coordinator went back to a checkpoint {len(restart)} times, expected once "
                 f"after both peers were dropped")
    before = [r["step"] for r in run.steps_final(rows[:restart[0]])]
    if before != list(range(len(before))) or len(before) < waited or back_to > len(before):
        run.fail(f"steps {before} were final before the run went back to step {back_to}, "
                 f"expected 0..{waited - 1} at least")
    run.check_all_steps_final(rows[restart[0]:], first=back_to)
    # The first to rejoin brings its checkpoint; the other loads its own or fetches it from the
    # first, whichever the coordinator's record allows when it joins.
    sources = {}
    for i in (0, 1):
        lives = run.incarnations(i)
        loaded = [e for e in lives[-1] if e["event"] == "state_loaded"] if len(lives) == 2 else []
        if not loaded or loaded[0]["applied_steps"] != back_to:
            run.fail(f"peer {i} restarted with {loaded[:1]}, expected the state after "
                     f"{back_to} steps")
        sources[i] = loaded[0]["source"]
    if "checkpoint" not in sources.values() or not set(sources.values()) <= {"checkpoint",
                                                                              "members"}:
        run.fail(f"the restarted peers loaded from {sources}: one must bring the checkpoint")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print(f"both peers killed after {len(before)} steps; restarted, the run went back to the checkpoint "
          f"after step {back_to} (loaded from {sources}) and finished identical")
    run.cleanup()


def scenario_join(agora, data):
    """A peer that joins mid-run fetches the parameters, catches up and matches the majority."""
    run = Run(agora, data, "join", peers=3, steps=40, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    waited = 12
    run.wait_final(waited)
    run.start_peer(2)
    run.wait_finished()
    run.check_all_steps_final()
    joined = run.events(2, "joined")
    loaded = run.events(2, "state_loaded")
    if len(joined) != 1 or joined[0]["finalized_steps"] < waited:
        run.fail(f"the joiner's join {joined}: expected one, after at least {waited} final steps")
    # Welcome hands out the newest state the members reported, never a future one.
    if not loaded or loaded[0]["source"] != "members" or \
            not 0 < loaded[0]["applied_steps"] <= joined[0]["finalized_steps"]:
        run.fail(f"the joiner loaded {loaded[:1]}, expected the members' state after 1.."
                 f"{joined[0]['finalized_steps']} steps")
    rounds = sorted(run.trained(2))
    if not rounds or rounds[0] < joined[0]["finalized_steps"]:
        run.fail(f"the joiner trained rounds {rounds}; expected some, all after the "
                 f"{joined[0]['finalized_steps']} steps final when it joined")
    if not any(run.short(2) in r["authors"] for r in run.steps_final()):
        run.fail("no payload of the joiner became final")
    run.check_identical(range(3), throughout=[0, 1])
    run.check_finished(range(3))
    print(f"joiner started from the state after step {loaded[0]['applied_steps']}, trained "
          f"{len(rounds)} rounds, and matched the majority's hash at every later step")
    run.cleanup()


def scenario_coordinator_restart(agora, data):
    """The coordinator killed with SIGKILL and restarted resumes without losing a final step."""
    run = Run(agora, data, "restart", peers=2, steps=30, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.wait_final(8)
    run.coordinator.send_signal(signal.SIGKILL)
    run.coordinator.wait()
    before = len(run.steps_final())
    rows_before = len(run.rows())
    time.sleep(1.5)
    run.start_coordinator()
    run.wait_finished()
    # The restarted coordinator resumes from its database: its first row says how many steps it
    # loaded as final ("step"), at least the rows printed before the kill, and its step rows go
    # on from there. It saves a step before printing its row, so a kill between the two loses
    # rows (before..loaded-1), never steps.
    after = run.rows()[rows_before:]
    # Its first row is the resume (kind "phase"); a new run would begin with a join at step 0.
    if not after or after[0].get("kind") != "phase" or after[0]["step"] < before:
        run.fail(f"the restarted coordinator did not resume from its database with at least "
                 f"{before} final steps: {after[:1]}")
    loaded = after[0]["step"]
    run.check_all_steps_final(lost=range(before, loaded))
    first = run.steps_final(after)[:1]
    if not first or first[0]["step"] != loaded:
        run.fail(f"the restarted coordinator's first step row is {first}, expected step {loaded}")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print(f"killed after {before} final steps; resumed and finished all {run.steps} with "
          f"identical peers")
    run.cleanup()


def other_tokens(run, data):
    """A copy of the token folder with one token of its training shard changed."""
    other = os.path.join(run.dir, "other-data")
    shutil.copytree(data, other)
    shard = os.path.join(other, "train_000000.bin")
    with open(shard, "r+b") as f:
        f.seek(1024 + 2 * 1000)  # past the 1024-byte header: token 1000 (uint16)
        token = f.read(2)
        f.seek(1024 + 2 * 1000)
        f.write(bytes([token[0] ^ 1, token[1]]))
    return other


def scenario_allowlist(agora, data):
    """Admission at the door: a key outside the allowlist is refused; a member whose token folder
    holds other tokens than the run's data.hash refuses to train. The run goes on without both."""
    data_hash = subprocess.run([agora, "data", "hash", data], check=True, capture_output=True,
                               text=True).stdout.strip()
    run = Run(agora, data, "allowlist", peers=3, steps=6,
              sets=["network.min_peers=2", f'data.hash="{data_hash}"'])
    stranger = run.keygen("stranger")
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    # Peer 2 is on the allowlist, but its folder differs from the run's by one token.
    real = run.data
    run.data = other_tokens(run, data)
    other = run.start_peer(2)
    run.data = real
    intruder = run.start_peer(9, key=os.path.join(run.dir, "stranger.key"),
                              extra=["--join-timeout", "6"])
    code = intruder.wait(timeout=60)
    del run.peers[9]
    if code == 0 or run.events(9, "joined"):
        run.fail(f"a peer whose key is not on the allowlist was let in (exit {code})")
    # The error a person reads (it is not a log line: agora's main prints "error: ...").
    if "allowlist" not in run.peer_log(9) or stranger not in run.peer_log(9):
        run.fail("the refused peer's error does not name its key and the allowlist")
    code = other.wait(timeout=60)
    del run.peers[2]
    if code == 0 or run.events(2, "trained"):
        run.fail(f"a peer whose tokens differ from data.hash trained (exit {code})")
    if "data.hash" not in run.peer_log(2) or data_hash not in run.peer_log(2):
        run.fail(f"the peer with other tokens did not say why, naming data.hash and {data_hash}: "
                 f"{run.peer_log(2)[-400:]}")
    run.wait_finished()
    run.check_all_steps_final()
    seen = [r for r in run.rows() if stranger[:8] in json.dumps(r)]
    if seen:
        run.fail(f"the stranger's key reached the coordinator's state machine: {seen[:2]}")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print("the stranger never got past the CURVE handshake, the member with other tokens refused "
          "to train; the run finished without them")
    run.cleanup()


def scenario_volunteer(agora, data):
    """A volunteer joins a running run with nothing but the coordinator's address and key: it
    fetches the run's data (checked chunk by chunk against the run's data hash) from the members
    that hold a copy, and from the coordinator, and trains the same sequences, bit for bit, as
    the members with a copy on disk."""
    data_hash = subprocess.run([agora, "data", "hash", data], check=True, capture_output=True,
                               text=True).stdout.strip()
    # The coordinator holds the data and serves it; the run config names no hash: the
    # coordinator records the folder's.
    run = Run(agora, data, "volunteer", peers=3, steps=20,
              sets=["network.min_peers=2", f'data.dir="{data}"'])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.wait_final(2)
    cache = os.path.join(run.dir, "fetched")
    run.start_peer(2, local_data=False, extra=["--data-cache", cache])
    run.wait_finished()
    run.check_all_steps_final()
    run.check_identical(range(3), throughout=[0, 1])
    run.check_finished(range(3))
    trained = run.sequences_by_round([2])
    if not trained:
        run.fail("the volunteer trained no round")
    mounted = run.events(2, "data_mount")
    shards = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)
                 if f.endswith(".bin"))
    if len(mounted) != 1 or mounted[0]["bytes"] != shards or mounted[0]["chunks_cached"] != 0:
        run.fail(f"the volunteer's data_mount event {mounted} does not name the run's {shards} "
                 f"bytes of shards, none cached")
    summary = run.events(2, "summary")[-1]
    # The prefetch fills the folder: every byte of the shards, fetched once, none refused. The
    # members with a copy were asked first (the Welcome names them as holders, and the
    # coordinator's Admit lets the volunteer in at once); what they were too busy for came from
    # the coordinator.
    if summary["data_bytes_fetched"] != shards or summary["data_chunks_refused"] != 0:
        run.fail(f"the volunteer fetched {summary['data_bytes_fetched']} bytes "
                 f"({summary['data_chunks_refused']} refused), expected the {shards} of the shards")
    if summary["data_bytes_from_peers"] == 0:
        run.fail("the members holding a copy served the volunteer nothing")
    # A joiner makes its strategy anew after loading the state: the payloads its witness check
    # decoded must still reach apply() (optim/decoded_payloads.h), and not pile up unused.
    if summary["payloads_predecoded"] == 0 or summary["decoded_payloads_kept"] > 3:
        run.fail(f"the volunteer's apply() took {summary['payloads_predecoded']} payloads decoded "
                 f"at fetch and {summary['decoded_payloads_kept']} were left: the check decodes "
                 f"into a store its strategy does not take from")
    for i in (0, 1):
        if run.events(i, "data_mount"):
            run.fail(f"peer {i} has the data on disk, yet fetched it")
    fetched = subprocess.run([agora, "data", "hash", cache], check=True, capture_output=True,
                             text=True).stdout.strip()
    if fetched != data_hash:
        run.fail(f"the volunteer's folder hashes to {fetched}, the run's data to {data_hash}")
    print(f"the volunteer fetched {shards} bytes of data {data_hash[:16]} "
          f"({summary['data_bytes_from_peers']} from members), trained rounds {sorted(trained)} "
          f"and held the same parameters as the members with a copy")
    run.cleanup()


def scenario_tamper(agora, data, adversary):
    """A member committing malformed payloads (the adversary's `garbage`: each payload cut in
    half, tests/adversary/) is rejected by the others, struck and dropped."""
    run = AdversaryRun(agora, adversary, data, "tamper", honest=2, adversaries=1, steps=16,
                       sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.start_adversary(2, "garbage")
    run.wait_finished()
    run.check_all_steps_final()
    # Dropped for strikes, it is refused for good (may_rejoin false) and the adversary exits.
    refused = run.actions(2, "refused")
    if not refused or refused[-1]["may_rejoin"]:
        run.fail(f"the tampering member was not refused for good: {refused}")
    bad = run.short(2)
    # None of its payloads can become final, and each that does not is a strike; strikes in a
    # row reach network.max_strikes, which drops it, and a dropped member is struck no more.
    max_strikes = int(run.cfg("network.max_strikes"))
    strikes = run.log_rows("strike", bad)
    drops = run.log_rows("drop", bad)
    if len(strikes) != max_strikes or len(drops) != 1:
        run.fail(f"the tampering peer {bad} got {len(strikes)} strikes and {len(drops)} drops, "
                 f"expected network.max_strikes = {max_strikes} and 1")
    if [r.get("strikes") for r in strikes] != list(range(1, max_strikes + 1)) or \
            drops[0].get("reason") != "strikes":
        run.fail(f"strike counts {[r.get('strikes') for r in strikes]} and drop reason "
                 f"{drops[0].get('reason')!r}, expected 1..{max_strikes} and 'strikes'")
    final = [r["step"] for r in run.steps_final() if bad in r["authors"]]
    if final:
        run.fail(f"the tampering peer's payloads became final at steps {final}")
    # Each honest witness fetched its payloads and refused them (hash, signature or layout).
    for i in (0, 1):
        summary = run.events(i, "summary")
        if not summary or summary[-1]["payloads_rejected"] < 1:
            run.fail(f"peer {i} rejected no payload: {summary[-1:]}")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print(f"tampering peer {bad} struck {max_strikes} times and dropped; honest peers identical "
          f"at every step")
    run.cleanup()


def scenario_slow_peer(agora, data):
    """A peer slowed on purpose (3x) receives a smaller share of each batch."""
    slowdown = 3
    run = Run(agora, data, "slow", peers=3, steps=20, sets=["network.min_peers=3"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.start_peer(2, extra=["--slowdown", str(slowdown)])
    run.wait_finished()
    run.check_all_steps_final()
    # Shares follow each member's measured throughput, an average with weight 1/2 of each
    # commit's sequences per compute second (docs/protocol.md section 6). Round 0 is split
    # before anything is measured; 4 measurements later the first (warm-up-skewed) one weighs
    # 1/16. From then the slow peer's share is 1/slowdown of a fast peer's; twice that leaves
    # room for the noise of timing a few sequences on a shared machine, and equal shares
    # (ratio 1) still fail.
    warmup = 1 + 4
    rounds = range(warmup, run.steps)
    # min_peers = 3: every round is split among the three, so a round a peer did not train was an
    # empty share (train_round records nothing then).
    by_round = run.sequences_by_round(range(3))
    wrong = {r: by_round.get(r) for r in range(run.steps) if by_round.get(r) != run.batch_size}
    if wrong:
        run.fail(f"rounds whose shares do not add up to train.batch_size = {run.batch_size}: "
                 f"{wrong}")
    shares = {i: run.trained(i) for i in range(3)}
    fast = [shares[i].get(r, 0) for i in (0, 1) for r in rounds]
    slow = [shares[2].get(r, 0) for r in rounds]
    mean_fast, mean_slow = sum(fast) / len(fast), sum(slow) / len(slow)
    if not mean_slow < (2 / slowdown) * mean_fast:
        run.fail(f"the slow peer's share ({mean_slow:.1f}) is not below 2/{slowdown} of the "
                 f"others' ({mean_fast:.1f})")
    run.check_identical(range(3), throughout=range(3))
    run.check_finished(range(3))
    print(f"shares after warm-up: fast peers {mean_fast:.1f} sequences, slow peer {mean_slow:.1f}")
    run.cleanup()


def scenario_tst(agora, data):
    """Token superposition in a decentralized run: every peer trains on bags of 2 for the first
    half of the steps and switches at the same step; the parameters stay identical throughout."""
    run = Run(agora, data, "tst", peers=2, steps=12, sets=["tst.bag=2", "tst.fraction=0.5"])
    run.start_coordinator()
    for i in range(2):
        run.start_peer(i)
    run.wait_finished()
    run.check_all_steps_final()
    steps = run.check_identical(range(2), throughout=range(2))
    run.check_finished(range(2))
    # RunConfig::tst_switch_step: round(tst.fraction x train.steps).
    switch = round(float(run.cfg("tst.fraction")) * run.steps)
    for i in range(2):
        switched = [e["round"] for e in run.events(i, "tst_switch")]
        if switched != [switch]:
            run.fail(f"peer {i} recorded the switch at rounds {switched}, expected [{switch}]")
    # The coordinator's row has no field for the step it names: its text is read.
    rounds = [r.get("round") for r in run.log_rows("tst_switch")]
    if rounds != [switch]:
        run.fail(f"the coordinator recorded the switch at rounds {rounds}, expected [{switch}]")
    print(f"both peers switched at step {switch}; identical parameters after each of "
          f"{len(steps)} applied-step counts")
    run.cleanup()


SCENARIOS = {
    "train": scenario_train,
    "kill_peer": scenario_kill_peer,
    "join": scenario_join,
    "restart_peer": scenario_restart_peer,
    "all_leave": scenario_all_leave,
    "coordinator_restart": scenario_coordinator_restart,
    "allowlist": scenario_allowlist,
    "volunteer": scenario_volunteer,
    "tamper": scenario_tamper,
    "slow_peer": scenario_slow_peer,
    "tst": scenario_tst,
}

if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[3] not in SCENARIOS or \
            (sys.argv[3] == "tamper") != (len(sys.argv) == 5):
        sys.exit(f"usage: network_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}} "
                 f"[AGORA_ADVERSARY (tamper only)]")
    try:
        SCENARIOS[sys.argv[3]](*sys.argv[1:3], *sys.argv[4:])
    except Exception:  # a log without a field the test reads, ...: a failure, processes stopped
        import traceback
        traceback.print_exc()
        for run in Run.started:
            run.stop()
        if Run.started and os.path.isdir(Run.started[-1].dir):
            Run.started[-1].fail("the test crashed (above)")
        sys.exit(1)
