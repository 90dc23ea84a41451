"""The harness of the network scenarios (network_test.py): a run of real `agora coordinator` and
`agora peer` processes on loopback, its launched config, and readers of what the processes record:
the coordinator's `--json` rows and the peers' `--log-format json` events.
"""
import json
import math
import os
import shutil
import signal
import random
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "network.toml")


_HANDED_OUT = set()


def free_port():
    """A port nobody listens on, taken below the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) may be given again as the source port of an outgoing connection before
    the process meant to listen on it binds it ("Address already in use"). Never the same port
    twice in one process: a run picks all its ports before anything listens on them, and two
    random picks of 24 among 16,000 collide about once in sixty runs."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randint(max(1024, low // 2), low - 1)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
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

    def verify_config(self):
        """The [verify] keys of the launched config (verification scenarios set all four, so no
        check leans on a default)."""
        return {"rate": float(self.cfg("verify.rate")),
                "seconds": float(self.cfg("verify.seconds")),
                "max_failures": int(self.cfg("verify.max_failures")),
                "window": int(self.cfg("verify.window"))}

    def peer_of(self, key, row):
        """The index of the peer a row names by key (full hex, or a prefix of 8 or more)."""
        if isinstance(key, str) and len(key) >= 8:
            key = key.lower()
            for i, k in enumerate(self.peer_keys):
                if k.lower() == key or (len(key) < len(k) and k.lower().startswith(key)):
                    return i
        self.fail(f"a row names key {key!r}, which is no peer of this run: {row}")

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

    @staticmethod
    def environment(env):
        """The child's environment: this process's plus `env` (e.g. {"AGORA_CRASH_AT": ...})."""
        return {**os.environ, **env} if env else None

    def start_coordinator(self, extra=("--http", "off"), env=None):
        args = [self.agora, "coordinator", "--config", CONFIG, "--key",
                os.path.join(self.dir, "coordinator.key"), "--json", *extra]
        for s in self.sets:
            args += ["--set", s]
        out = open(os.path.join(self.dir, "coordinator.jsonl"), "a")
        err = open(os.path.join(self.dir, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(args, stdout=out, stderr=err,
                                            env=self.environment(env))

    def start_peer(self, i, key=None, extra=(), env=None, prefix=(), local_data=True):
        """Starts peer i; `prefix` goes before the command (e.g. taskset -c 1). Without
        `local_data` the peer gets no --data: it fetches the run's data (extra names where)."""
        key = key or os.path.join(self.dir, f"peer-{i}.key")
        data = ["--data", self.data] if local_data else []
        args = [*prefix, self.agora, "peer", "--coordinator", f"tcp://127.0.0.1:{self.port}",
                "--coordinator-key", self.coordinator_key, "--key", key, *data,
                "--listen", "tcp://127.0.0.1:*", "--threads", "1", "--log-format", "json",
                "--checkpoint-dir", os.path.join(self.dir, f"ckpt-{i}"), *extra]
        log = open(os.path.join(self.dir, f"peer-{i}.log"), "a")
        self.peers[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.environment(env))
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

    def check_loss_falls(self, losses=None, window=3):
        """The mean loss of the last `window` steps is below that of the first `window` by more
        than their noise (losses: the coordinator's step rows unless given). A step's loss is the
        mean over train.batch_size x data.seq_len tokens; each token's loss lies within a few nats
        of the uniform ln(vocab_size) the model starts at, so `window` steps' mean is known to
        about ln(V) / sqrt(window B T), and a fall of 4 times that (times sqrt(2) for a
        difference) is no accident of the batches drawn. Runs whose steps jump (a hostile member
        kicks the weights now and then) need wider windows than 3: one jump in 3 steps can hide
        the whole fall."""
        if losses is None:
            losses = [r["loss"] for r in self.steps_final()]
        losses = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
        if len(losses) < 2 * window:
            self.fail(f"only {len(losses)} losses reported, fewer than two windows of {window}")
        tokens = window * self.batch_size * int(self.cfg("data.seq_len"))
        margin = 4 * math.sqrt(2) * math.log(int(self.cfg("model.vocab_size"))) / math.sqrt(tokens)
        first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
        if not last < first - margin:
            self.fail(f"the loss did not fall by more than {margin:.3f}: first {window} steps "
                      f"{first:.3f}, last {window} steps {last:.3f}")
        print(f"loss {first:.3f} -> {last:.3f} over {len(losses)} steps (means of {window} steps; "
              f"noise bound {margin:.3f})")

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
