#!/usr/bin/env python3
"""Decentralized runs with real processes on loopback: one scenario per invocation.

    network_test.py AGORA DATA_DIR SCENARIO

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
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "network.toml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_config(path, sets):
    """The run config the coordinator resolves: the TOML file, then each --set KEY=VALUE (a TOML
    value if it parses as one, else the text as a string, as agora's TomlConfig::apply_override)."""
    with open(path, "rb") as f:
        config = tomllib.load(f)
    for assignment in sets:
        key, _, text = assignment.partition("=")
        text = text.strip()
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        *parents, leaf = key.strip().split(".")
        table = config
        for part in parents:
            table = table.setdefault(part, {})
        table[leaf] = value
    return config


def parse_json_lines(path):
    """The JSON objects among a file's lines; other lines are skipped."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                j = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill, or a warning that starts with '{'
            if isinstance(j, dict):
                out.append(j)
    return out


def multiples(k, first, last):
    """The applied-step counts in [first, last] at which a peer reports its state (every k)."""
    return set(range(-(-first // k) * k, last + 1, k))


class Run:
    started = []  # every Run, so that a test that crashes still stops its processes

    def __init__(self, agora, data, name, peers, steps, sets=()):
        self.coordinator = None
        self.peers = {}
        Run.started.append(self)
        self.agora, self.data = agora, data
        self.dir = tempfile.mkdtemp(prefix=f"agora-{name}-")
        self.steps = steps
        self.port = free_port()
        self.coordinator_key = self.keygen("coordinator")
        self.peer_keys = [self.keygen(f"peer-{i}") for i in range(peers)]
        with open(os.path.join(self.dir, "allowlist.txt"), "w") as f:
            f.write("\n".join(self.peer_keys) + "\n")
        self.sets = [f'network.listen="tcp://127.0.0.1:{self.port}"',
                     f'network.allowlist="{self.dir}/allowlist.txt"',
                     f'network.state_db="{self.dir}/coordinator.db"',
                     f"train.steps={steps}", *sets]
        self.config = load_config(CONFIG, self.sets)

    # ---------------------------------------------------------------------------- the config

    def cfg(self, dotted):
        """A key of the launched run config (network.toml + --set), e.g. "network.hash_interval"."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"{dotted} is neither in {CONFIG} nor set by the scenario")
            node = node[part]
        return node

    @property
    def hash_interval(self):
        return int(self.cfg("network.hash_interval"))

    @property
    def batch_size(self):
        return int(self.cfg("train.batch_size"))

    def short(self, i):
        """Peer i's short key, as the coordinator's rows and the peer's own lines name it."""
        return self.peer_keys[i][:8]

    # ---------------------------------------------------------------------------- processes

    def keygen(self, name):
        out = subprocess.run([self.agora, "keygen", "--out", os.path.join(self.dir, name + ".key")],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def start_coordinator(self, extra=("--http", "off")):
        args = [self.agora, "coordinator", "--config", CONFIG, "--key",
                os.path.join(self.dir, "coordinator.key"), "--json", *extra]
        for s in self.sets:
            args += ["--set", s]
        out = open(os.path.join(self.dir, "coordinator.jsonl"), "a")
        err = open(os.path.join(self.dir, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(args, stdout=out, stderr=err)

    def start_peer(self, i, key=None, extra=()):
        key = key or os.path.join(self.dir, f"peer-{i}.key")
        args = [self.agora, "peer", "--coordinator", f"tcp://127.0.0.1:{self.port}",
                "--coordinator-key", self.coordinator_key, "--key", key, "--data", self.data,
                "--listen", "tcp://127.0.0.1:*", "--threads", "1", "--log-format", "json",
                "--checkpoint-dir", os.path.join(self.dir, f"ckpt-{i}"), *extra]
        log = open(os.path.join(self.dir, f"peer-{i}.log"), "a")
        self.peers[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        return self.peers[i]

    def kill_peer(self, i):
        self.peers[i].send_signal(signal.SIGKILL)
        self.peers[i].wait()
        del self.peers[i]

    # ---------------------------------------------------------------------------- the coordinator

    def rows(self):
        return parse_json_lines(os.path.join(self.dir, "coordinator.jsonl"))

    def steps_final(self, rows=None):
        return [r for r in (self.rows() if rows is None else rows) if r.get("event") == "step"]

    def log_rows(self, kind=None, peer=None, rows=None):
        """The coordinator's event rows ({"event": "log", "kind", "text", "step", "peer"}), of
        one kind (coord::EventKind: join, strike, drop, restart, phase, tst_switch, ...) and about
        one peer (its short key)."""
        out = []
        for r in (self.rows() if rows is None else rows):
            if r.get("event") != "log":
                continue
            if "kind" not in r:
                self.fail(f"a coordinator event row has no kind: {r}")
            if kind is not None and r["kind"] != kind:
                continue
            if peer is not None and r.get("peer") != peer:
                continue
            out.append(r)
        return out

    def check_all_steps_final(self, rows=None, first=0, lost=()):
        """The coordinator printed one row for each step first..train.steps-1, in order, none
        twice (rows: all of coordinator.jsonl unless given). `lost`: steps whose row may be
        missing (see coordinator_restart)."""
        steps = [r["step"] for r in self.steps_final(rows)]
        if len(steps) != len(set(steps)) or steps != sorted(steps):
            self.fail(f"finalized step rows are not increasing and unique: {steps}")
        missing = set(range(first, self.steps)) - set(steps)
        if missing - set(lost) or any(not first <= s < self.steps for s in steps):
            self.fail(f"finalized steps {steps}, expected {first}..{self.steps - 1}")
        return steps

    # ---------------------------------------------------------------------------- the peers

    def peer_log(self, i):
        return open(os.path.join(self.dir, f"peer-{i}.log"), errors="replace").read()

    def events(self, i, event=None):
        """Peer i's structured log events ("event" key), optionally of one kind."""
        return [j for j in parse_json_lines(os.path.join(self.dir, f"peer-{i}.log"))
                if "event" in j and (event is None or j["event"] == event)]

    def incarnations(self, i):
        """Peer i's events per process: its log is appended to by every restart, and each process
        records "joined" once (a rejoin within one process is "rejoin")."""
        out = []
        for e in self.events(i):
            if e["event"] == "joined" or not out:
                out.append([])
            out[-1].append(e)
        return out

    def states(self, i, events=None):
        """applied steps -> state hash, the latest report for each count."""
        return {e["applied_steps"]: e["hash"]
                for e in (self.events(i) if events is None else events) if e["event"] == "state"}

    def trained(self, i, events=None):
        """round -> sequences trained, from peer i's "trained" events (of one process, or of all:
        a run that went back to a checkpoint trains its rounds again; the latest counts)."""
        out = {}
        for life in (self.incarnations(i) if events is None else [events]):
            seen = set()
            for e in life:
                if e["event"] == "trained":
                    if e["round"] in seen:
                        self.fail(f"peer {i} trained round {e['round']} twice in one process")
                    seen.add(e["round"])
                    out[e["round"]] = e["sequences"]
        return out

    def sequences_by_round(self, peers):
        """round -> total sequences the given peers trained in it."""
        total = {}
        for i in peers:
            for r, n in self.trained(i).items():
                total[r] = total.get(r, 0) + n
        return total

    def check_reports(self, i):
        """Within each of peer i's processes, a state report at every hash_interval-th applied
        step from where it started (the seed's step 0, or the state it loaded) to where it
        stopped: a peer applies finalized steps one at a time and reports at each multiple of
        network.hash_interval (docs/protocol.md section 8)."""
        k = self.hash_interval
        for n, events in enumerate(self.incarnations(i)):
            reported = sorted({e["applied_steps"] for e in events if e["event"] == "state"})
            if not reported:
                continue
            missing = multiples(k, reported[0], reported[-1]) - set(reported)
            if missing:
                self.fail(f"peer {i} (process {n + 1}) applied steps {reported[0]}..{reported[-1]} "
                          f"but reported no state after {sorted(missing)}")

    def check_identical(self, peers, throughout):
        """Every applied-step count that two or more of `peers` reported has one hash, and the
        peers in `throughout`, which took part from step 0 to the end (in one process or
        several), each reported every hash_interval-th count in [0, train.steps]; so at least
        two did whenever two are in `throughout`. Returns the counts compared."""
        by_step = {}
        for i in peers:
            self.check_reports(i)
            for step, h in self.states(i).items():
                by_step.setdefault(step, {})[i] = h
        shared = {s: hs for s, hs in by_step.items() if len(hs) >= 2}
        for step, hs in sorted(shared.items()):
            if len(set(hs.values())) != 1:
                self.fail(f"after step {step} the peers' parameters differ: {hs}")
        expected = multiples(self.hash_interval, 0, self.steps)
        for i in throughout:
            missing = expected - set(self.states(i))
            if missing:
                self.fail(f"peer {i} took part throughout but reported no state after "
                          f"{sorted(missing)} applied steps")
        if len(throughout) >= 2 and not expected <= set(shared):
            self.fail(f"states after {sorted(expected - set(shared))} applied steps were not "
                      f"compared between two peers")
        return sorted(shared)

    def check_finished(self, peers):
        """Each of `peers` recorded "finished" after applying all train.steps steps, all with
        one state hash."""
        ends = {}
        for i in peers:
            finished = self.events(i, "finished")
            if not finished:
                self.fail(f"peer {i} did not record finishing the run")
            ends[i] = (finished[-1]["applied_steps"], finished[-1]["hash"])
            if ends[i][0] != self.steps:
                self.fail(f"peer {i} finished after {ends[i][0]} applied steps, expected "
                          f"{self.steps} (train.steps)")
        if len(set(ends.values())) != 1:
            self.fail(f"the peers finished with different parameters: {ends}")

    def check_loss_falls(self, losses=None):
        """The mean loss of the last 3 steps is below that of the first 3 by more than their
        noise (losses: the coordinator's step rows unless given). A step's loss is the mean over
        train.batch_size x data.seq_len tokens; each token's loss lies within a few nats of the
        uniform ln(vocab_size) the model starts at, so 3 steps' mean is known to about
        ln(V) / sqrt(3 B T), and a fall of 4 times that (times sqrt(2) for a difference) is no
        accident of the batches drawn."""
        if losses is None:
            losses = [r["loss"] for r in self.steps_final()]
        losses = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
        if len(losses) < 6:
            self.fail(f"only {len(losses)} losses reported")
        tokens = 3 * self.batch_size * int(self.cfg("data.seq_len"))
        margin = 4 * math.sqrt(2) * math.log(int(self.cfg("model.vocab_size"))) / math.sqrt(tokens)
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        if not last < first - margin:
            self.fail(f"the loss did not fall by more than {margin:.3f}: first steps {first:.3f}, "
                      f"last steps {last:.3f}")
        print(f"loss {first:.3f} -> {last:.3f} over {len(losses)} steps (noise bound {margin:.3f})")

    # ---------------------------------------------------------------------------- waiting

    def wait_until(self, what, predicate, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if predicate():
                return
            if self.coordinator and self.coordinator.poll() not in (None, 0):
                self.fail(f"the coordinator exited with {self.coordinator.returncode} while "
                          f"waiting for {what}")
            time.sleep(0.2)
        self.fail(f"timed out after {timeout} s waiting for {what}")

    def wait_final(self, n, timeout=120):
        self.wait_until(f"{n} finalized steps", lambda: len(self.steps_final()) >= n, timeout)

    def wait_finished(self, timeout=90, failing=()):
        """The coordinator exits 0 and every peer still running exits: 0, except those in
        `failing`, which must exit with an error."""
        self.wait_until("the coordinator to finish", lambda: self.coordinator.poll() is not None,
                        timeout)
        if self.coordinator.returncode != 0:
            self.fail(f"the coordinator exited with {self.coordinator.returncode}")
        for i, p in self.peers.items():
            try:
                code = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail(f"peer {i} did not exit after the run finished")
            if (code != 0) != (i in failing):
                self.fail(f"peer {i} exited with {code}, expected "
                          f"{'an error' if i in failing else '0'}")

    def fail(self, message):
        self.stop()
        print(f"FAIL: {message}\n--- logs in {self.dir} ---")
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".jsonl")):
                text = open(os.path.join(self.dir, name), errors="replace").read()
                print(f"--- {name} (last 25 lines) ---")
                print("\n".join(text.splitlines()[-25:]))
        print(f"FAIL: {message}")  # again, below the logs
        sys.exit(1)

    def stop(self):
        for p in list(self.peers.values()) + [self.coordinator]:
            if p and p.poll() is None:
                p.kill()
                p.wait()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


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


def scenario_allowlist(agora, data):
    """A key outside the allowlist is refused; the run goes on without it."""
    run = Run(agora, data, "allowlist", peers=2, steps=6, sets=["network.min_peers=2"])
    stranger = run.keygen("stranger")
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    intruder = run.start_peer(9, key=os.path.join(run.dir, "stranger.key"),
                              extra=["--join-timeout", "6"])
    code = intruder.wait(timeout=60)
    del run.peers[9]
    if code == 0 or run.events(9, "joined"):
        run.fail(f"a peer whose key is not on the allowlist was let in (exit {code})")
    # The error a person reads (it is not a log line: agora's main prints "error: ...").
    if "allowlist" not in run.peer_log(9) or stranger not in run.peer_log(9):
        run.fail("the refused peer's error does not name its key and the allowlist")
    run.wait_finished()
    run.check_all_steps_final()
    seen = [r for r in run.rows() if stranger[:8] in json.dumps(r)]
    if seen:
        run.fail(f"the stranger's key reached the coordinator's state machine: {seen[:2]}")
    run.check_identical([0, 1], throughout=[0, 1])
    run.check_finished([0, 1])
    print("the stranger never got past the CURVE handshake; the run finished without it")
    run.cleanup()


def scenario_tamper(agora, data):
    """A peer committing malformed payloads is rejected by the others, struck and dropped."""
    run = Run(agora, data, "tamper", peers=3, steps=16, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.start_peer(2, extra=["--misbehave", "garbage-payload"])
    # Dropped for strikes, it is refused for good and exits with an error.
    run.wait_finished(failing=[2])
    run.check_all_steps_final()
    bad = run.short(2)
    # None of its payloads can become final, and each that does not is a strike; strikes in a
    # row reach network.max_strikes, which drops it, and a dropped member is struck no more.
    max_strikes = int(run.cfg("network.max_strikes"))
    strikes = run.log_rows("strike", bad)
    drops = run.log_rows("drop", bad)
    if len(strikes) != max_strikes or len(drops) != 1:
        run.fail(f"the tampering peer {bad} got {len(strikes)} strikes and {len(drops)} drops, "
                 f"expected network.max_strikes = {max_strikes} and 1")
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
    rows = run.log_rows("tst_switch")
    if len(rows) != 1 or not re.match(rf"step {switch}:", rows[0]["text"]):
        run.fail(f"the coordinator's events {[r['text'] for r in rows]} do not show one switch at "
                 f"step {switch}")
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
    "tamper": scenario_tamper,
    "slow_peer": scenario_slow_peer,
    "tst": scenario_tst,
}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in SCENARIOS:
        sys.exit(f"usage: network_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}}")
    try:
        SCENARIOS[sys.argv[3]](sys.argv[1], sys.argv[2])
    except Exception:  # a log without a field the test reads, ...: a failure, processes stopped
        import traceback
        traceback.print_exc()
        for run in Run.started:
            run.stop()
        if Run.started and os.path.isdir(Run.started[-1].dir):
            Run.started[-1].fail("the test crashed (above)")
        sys.exit(1)
