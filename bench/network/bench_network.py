#!/usr/bin/env python3
"""bench/network: a decentralized run over emulated internet links, side by side.

    bench_network.py --agora build/apps/agora/agora [--data data/tokens/sp8k] [--json FILE]
                     [--steps N] [--scenario NAME[,NAME...]|all] [--verify-modes 0,1,default]
                     [--verify-rate R] [--keep] [--peer-logs]

Every process is real (a coordinator, peers, CURVE over ZeroMQ); every connection goes through
`agora link`, the user-space link shaper (this kernel has no netem), so each link has the
bandwidth, delay, jitter and loss of the profile. A peer reaches the coordinator through a
shaper in front of the coordinator's port, and other peers reach it through a shaper in front of
its own port (--advertise), so fetches cross a shaped link too. Each connection is shaped on its
own: a peer's uplink is not shared among the peers downloading from it.

Scenarios (--scenario takes a comma-separated list; `all` runs every one, in this order). Links
are PROFILE (20 Mbit/s, 50 ms each way, 5 ms jitter, 1% loss) unless a scenario says otherwise;
the goal printed beside each figure is in brackets here.
Issue 5's figures:
  utilisation  4 peers, 64 sequences a step, network.overlap 0 and 1: each peer's time computing
               / wall time (median and lowest of the peers; overlap 1: median >= 95%), and
               seconds per step.
  straggler    one peer of 2 is 3x slower (--slowdown 3): the run's tokens/s against the sum of
               each peer's tokens/s training alone on the same links (>= 90%).
  join         a peer joins a running 2-peer run (32 sequences a step) after 8 steps: its time
               from start to its first payload in a finalized step, against 1.5 x model bytes /
               link bandwidth + one round (<= 1). The run is stopped once the joiner is in.
Issue 43's figures (faster where the internet is worst and the run is largest):
  harsh        8 peers over HARSH_PROFILE (10 Mbit/s, 100 ms each way, 10 ms jitter, 2% loss),
               network.overlap 1, default spot checks: utilisation (median >= 95%, as issue 5's
               overlap-1 goal, and the lowest peer) and seconds per step. 128 sequences a step:
               each peer's share is then 16 sequences (two micro-batches of 8), as in
               `utilisation` (64 over 4 peers), so a peer's compute per round matches that
               row's, and the coordinator's uneven split by measured throughput still leaves
               every peer at least one whole micro-batch (64 would leave exactly one, and a peer
               measured a little slower would get a partial one). network.min_deadline_seconds
               is 4x network.toml's (run_harsh says why).
  straggler5   one peer of 4 is 5x slower (--slowdown 5). Solo: four single-peer runs (three
               normal peers, one 5x slower), each with its own coordinator, started together
               so that the same four processes share the two cores as in the run together;
               their tokens/s over the window when all four run, summed. Together: one run of
               the four, 128 sequences a step. Each solo trains the share of the batch it would
               get in the run together (the coordinator splits by measured throughput: 40 for a
               normal peer, 8 for the slowed one), so its rounds are as long as the run's and
               pay the same per-round costs. Result: together / sum of solo (>= 95%). Every run
               here has network.min_deadline_seconds 5x network.toml's (slower hardware).
  join4        `join`, with 4 peers running (network.min_peers 4, 64 sequences a step: 16 a
               holder, as in `join`) before the joiner comes, so it can fetch the parameters
               from 4 holders; the same ratio to the same bound (<= 0.5).
  verify       4 peers, 64 sequences a step, network.overlap 1, one run per --verify-modes
               entry: 0 (verify.rate 0), 1 (verify.rate --verify-rate with
               verify.state_fraction 1: a check fetches the author's whole momentum), default
               (verify.rate --verify-rate, state_fraction left at its default), or any other
               fraction F (state_fraction F): utilisation (median and lowest), seconds per step,
               and the spot checks from the coordinator's "verify" rows: drawn, and how many
               ended passed, author_failed or unresolved (a check still open when the run ends
               is counted in drawn only). At rate 0.02, 4 peers and 12 steps draw about one
               check; --verify-rate raises the rate to see more. A mode the binary refuses (an
               unknown key) is reported as failed and the other modes still run.
The machine has 2 cores: peers share them, so compute is slower than on a machine per peer;
the ratios, not the absolute rates, are the result.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "network.toml")
PROFILE = "rate=20mbit,delay=50ms,jitter=5ms,loss=1%"
HARSH_PROFILE = "rate=10mbit,delay=100ms,jitter=10ms,loss=2%"
SEQ_LEN = 256  # network.toml's data.seq_len: tokens per sequence
PEER_LOGS = False  # --peer-logs
SKIP = 3       # finalized steps left out of a tokens/s figure (joins, warm-up)
# The harsh row's goal: issue 5's overlap-1 goal (>= 95% utilisation) held on the harsh links.
HARSH_GOAL = 0.95


def min_deadline_seconds():
    """network.min_deadline_seconds as network.toml sets it."""
    m = re.search(r"^\s*min_deadline_seconds\s*=\s*([\d.]+)", open(CONFIG).read(), re.M)
    return float(m.group(1))


def rate_bits(profile):
    """A profile's bandwidth in bits per second (the `rate` key, as `agora link` reads it:
    bit, kbit, mbit or gbit, an optional "/s"); None when unlimited."""
    for part in profile.split(","):
        key, _, value = part.strip().partition("=")
        if key.strip() != "rate":
            continue
        value = value.strip().lower().removesuffix("/s")
        if value in ("0", "unlimited"):
            return None
        m = re.fullmatch(r"([\d.]+(?:e[+-]?\d+)?)\s*(bit|kbit|mbit|gbit)", value)
        if not m:
            raise ValueError(f"link profile {profile!r}: cannot read rate {value!r}")
        return float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    return None


RATE_BITS = rate_bits(PROFILE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, agora, data, name, sets, profile=PROFILE):
        self.agora, self.data, self.profile = agora, data, profile
        self.rate_bits = rate_bits(profile)  # what a bound divides by: this cluster's links
        self.dir = tempfile.mkdtemp(prefix=f"agora-bench-{name}-")
        self.procs, self.peers = [], {}
        self.port = free_port()
        self.coordinator_key = self.keygen("coordinator")
        self.sets = [f'network.listen="tcp://127.0.0.1:{self.port}"',
                     f'network.state_db="{self.dir}/coordinator.db"', "network.open=true", *sets]
        self.front = self.shaper(self.port)  # the coordinator, as peers reach it
        self.started = {}

    def keygen(self, name):
        out = subprocess.run([self.agora, "keygen", "--out", os.path.join(self.dir, name + ".key")],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def shaper(self, target_port):
        port = free_port()
        p = subprocess.Popen([self.agora, "link", "--listen", str(port), "--to",
                              f"127.0.0.1:{target_port}", "--profile", self.profile],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return port

    def start_coordinator(self):
        args = [self.agora, "coordinator", "--http", "off", "--config", CONFIG, "--key",
                os.path.join(self.dir, "coordinator.key"), "--json"]
        for s in self.sets:
            args += ["--set", s]
        self.coordinator = subprocess.Popen(
            args, stdout=open(os.path.join(self.dir, "coordinator.jsonl"), "w"),
            stderr=open(os.path.join(self.dir, "coordinator.log"), "w"))
        self.procs.append(self.coordinator)

    def start_peer(self, name, extra=()):
        key = self.keygen(name)
        own = free_port()
        public = self.shaper(own)
        args = [self.agora, "peer", "--coordinator", f"tcp://127.0.0.1:{self.front}",
                "--coordinator-key", self.coordinator_key, "--key",
                os.path.join(self.dir, name + ".key"),
                *(["--data", self.data] if self.data else []),
                "--listen", f"tcp://127.0.0.1:{own}", "--advertise",
                f"tcp://127.0.0.1:{public}", "--threads", "1",
                *(["--log-format", "json"] if PEER_LOGS else ["--quiet"]), *extra]
        self.started[name] = time.time()
        p = subprocess.Popen(args, stdout=open(os.path.join(self.dir, name + ".out"), "w"),
                             stderr=open(os.path.join(self.dir, name + ".log"), "w"))
        self.peers[name] = (p, key)
        self.procs.append(p)
        return key

    def events(self):
        """Every JSON line the coordinator printed: step rows and event rows."""
        out = []
        for line in open(os.path.join(self.dir, "coordinator.jsonl")):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def rows(self):
        return [j for j in self.events() if j.get("event") == "step"]

    def wait_steps(self, n, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if len(self.rows()) >= n:
                return
            if self.coordinator.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{len(self.rows())} of {n} steps after {timeout} s; logs in {self.dir}")

    def wait_done(self, timeout, peers=True):
        """Wait for the coordinator to finish the run, and with `peers` for every peer to exit
        (a peer prints its summary as it exits)."""
        try:
            self.coordinator.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the run was not done after {timeout} s ({len(self.rows())} "
                               f"steps); logs in {self.dir}") from None
        if self.coordinator.returncode != 0:
            log = open(os.path.join(self.dir, "coordinator.log")).read().strip().splitlines()
            raise RuntimeError(f"the coordinator exited with status {self.coordinator.returncode}"
                               f": {log[-1] if log else '(no log)'}; logs in {self.dir}")
        for name, (p, _) in self.peers.items() if peers else ():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{name} had not exited 60 s after the run finished; logs in "
                                   f"{self.dir}") from None

    def summary(self, name):
        text = open(os.path.join(self.dir, name + ".out")).read()
        m = re.search(r"compute ([\d.]+) s of ([\d.]+) s wall", text)
        if not m:
            raise RuntimeError(f"{name} printed no summary; logs in {self.dir}")
        return float(m.group(1)), float(m.group(2))

    def close(self, keep=False):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if keep:
            print(f"  logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


# --- shared measurements -------------------------------------------------------------------------

def seconds_per_step(rows):
    """Wall seconds per finalized step, from the second finalized step to the last (the first
    holds the start-up); None with fewer than 3 steps."""
    if len(rows) < 3:
        return None
    return (rows[-1]["time"] - rows[1]["time"]) / (len(rows) - 2)


def steady(rows):
    """The rows from the SKIP-th on, or fewer left out when the run is short (at least two kept
    where there are two)."""
    return rows[min(SKIP, max(0, len(rows) - 2)):]


def tokens_per_second(rows):
    """Tokens of every step after the first of `rows` / the time from the first to the last."""
    if len(rows) < 2 or rows[-1]["time"] <= rows[0]["time"]:
        return None
    return sum(r["sequences"] for r in rows[1:]) * SEQ_LEN / (rows[-1]["time"] - rows[0]["time"])


def measure_utilisation(args, name, peers, sets, profile=PROFILE, seconds_per_step_allowed=30):
    """One run of `peers` peers for --steps steps: each peer's compute / wall time as the peer
    prints it at the end (median and lowest), and the run's seconds per step. Returns (figures,
    the coordinator's JSON lines) for the caller to read more from."""
    c = Cluster(args.agora, args.data, name,
                [f"network.min_peers={peers}", f"train.steps={args.steps}", *sets], profile)
    names = [f"peer-{i}" for i in range(peers)]
    try:
        c.start_coordinator()
        for n in names:
            c.start_peer(n)
        c.wait_done(timeout=60 + 10 * peers + seconds_per_step_allowed * args.steps)
        ratios = [compute / wall for compute, wall in map(c.summary, names)]
        events = c.events()
    finally:
        c.close(keep=args.keep)
    rows = [e for e in events if e.get("event") == "step"]
    return {"peers": peers, "profile": profile, "steps": len(rows),
            "utilisation_median": statistics.median(ratios), "utilisation_min": min(ratios),
            "utilisation_per_peer": ratios, "seconds_per_step": seconds_per_step(rows)}, events


def measure_join(args, name, holders, batch_size, profile=PROFILE):
    """`holders` peers train; after 8 steps a joiner starts: its time from start to its first
    payload in a finalized step, against 1.5 x model bytes / link bandwidth + one round. The run
    is stopped once the joiner is in: every figure is read by then."""
    c = Cluster(args.agora, args.data, name,
                [f"network.min_peers={holders}", f"train.steps={max(args.steps, 40)}",
                 f"train.batch_size={batch_size}"], profile)
    try:
        c.start_coordinator()
        for i in range(holders):
            c.start_peer(f"peer-{i}")
        c.wait_steps(8, timeout=600)
        short = c.start_peer("joiner")[:8]
        began = c.started["joiner"]
        accepted = None
        end = time.time() + 900
        while accepted is None and time.time() < end:
            for r in c.rows():
                if short in r.get("authors", []):
                    accepted = r["time"]
                    break
            if accepted is None and c.coordinator.poll() is not None:
                break
            time.sleep(0.2)
        rows = c.rows()
        if accepted is None:
            raise RuntimeError(f"the joiner's payload was never accepted; logs in {c.dir}")
    finally:
        c.close(keep=args.keep)
    round_s = statistics.median(b["time"] - a["time"] for a, b in zip(rows[2:], rows[3:]))
    model_bytes = rows[-1]["allreduce_bytes"]  # 4 bytes per parameter: the fp32 model
    transfer = model_bytes * 8 / c.rate_bits
    took = accepted - began
    return {"holders": holders, "profile": profile, "model_bytes": model_bytes,
            "link_bits_per_second": c.rate_bits, "bytes_over_bandwidth_seconds": transfer,
            "round_seconds": round_s, "join_to_first_accepted_seconds": took,
            "ratio_to_bound": took / (1.5 * transfer + round_s)}


def verify_counts(events):
    """The spot checks in the coordinator's "verify" rows: drawn (the sum of each round's
    draw), assigned (distinct contributions given a verifier), and how they ended."""
    rows = [e for e in events if e.get("event") == "log" and e.get("kind") == "verify"]
    ends = {}
    for r in rows:
        if r.get("check") in ("passed", "author_failed", "unresolved"):
            ends.setdefault((r["round"], r.get("author")), r["check"])
    count = {k: sum(1 for v in ends.values() if v == k)
             for k in ("passed", "author_failed", "unresolved")}
    return {"drawn": sum(r.get("checks", 0) for r in rows if r.get("check") == "drawn"),
            "assigned": len({(r["round"], r.get("author")) for r in rows
                             if r.get("check") == "assigned"}),
            "verdicts": sum(1 for r in rows if r.get("check") == "verdict"),
            "resolved": count["passed"] + count["author_failed"], **count}


# --- scenarios -----------------------------------------------------------------------------------

def run_utilisation(args):
    out = {}
    for overlap in (0, 1):
        out[f"overlap{overlap}"], _ = measure_utilisation(
            args, f"util{overlap}", 4, [f"network.overlap={overlap}", "train.batch_size=64"])
    return out


def run_straggler(args):
    """Solo tokens/s of a normal and a 3x slower peer, then both together."""
    def one(name, peers):
        c = Cluster(args.agora, args.data, name,
                    [f"network.min_peers={len(peers)}", f"train.steps={args.steps}",
                     "train.batch_size=32"])
        try:
            c.start_coordinator()
            for i, extra in enumerate(peers):
                c.start_peer(f"peer-{i}", extra)
            c.wait_done(timeout=60 + 60 * args.steps)
            rows = c.rows()[3:]
            span = rows[-1]["time"] - rows[0]["time"]
            seqs = sum(r["sequences"] for r in rows[1:])
            return seqs * 256 / span
        finally:
            c.close(keep=args.keep)
    solo_fast = one("solo-fast", [[]])
    solo_slow = one("solo-slow", [["--slowdown", "3"]])
    together = one("together", [[], ["--slowdown", "3"]])
    return {"solo_fast_tokens_per_second": solo_fast,
            "solo_slow_tokens_per_second": solo_slow,
            "run_tokens_per_second": together,
            "ratio": together / (solo_fast + solo_slow)}


def run_join(args):
    return measure_join(args, "join", holders=2, batch_size=32)


def run_harsh(args):
    """8 peers on the harsh links, overlap 1 (see the module docstring for the batch of 128).

    Until the coordinator has measured a peer, a round's deadline is network.min_deadline_seconds
    (30 s in network.toml), and a late commit is ignored, so it measures nothing: 8 cold peers on
    2 cores (a compiler beside them) took 50 to 65 s over their first 16 sequences, missed three
    deadlines in a row and were all dropped. The floor here is 4x, a floor only: a round closes
    as soon as every commit is in."""
    out, _ = measure_utilisation(args, "harsh", 8,
                                 ["network.overlap=1", "train.batch_size=128",
                                  f"network.min_deadline_seconds={4 * min_deadline_seconds():g}"],
                                 profile=HARSH_PROFILE, seconds_per_step_allowed=90)
    out["link_bits_per_second"] = rate_bits(HARSH_PROFILE)
    out["batch_size"] = 128
    return out


def run_straggler5(args):
    """Four solo runs at once (three normal peers, one 5x slower), then the four together."""
    slowdown, normal, batch = 5, 3, 128
    # The coordinator splits a batch by measured throughput: a slowed peer gets 1/slowdown of a
    # normal peer's share. Each solo trains that share, so its rounds are as long as the run's.
    unit = batch / (normal * slowdown + 1)
    normal_batch, slow_batch = round(unit * slowdown), max(1, round(unit))
    solos = [(f"solo-{i}", (), normal_batch) for i in range(normal)]
    solos.append(("solo-slow", ("--slowdown", str(slowdown)), slow_batch))
    # Slower hardware needs longer deadlines (as tests/integration/verify_test.py scales them):
    # until the coordinator has measured a peer, a round's deadline is min_deadline_seconds, and
    # the 5x peer's first rounds (the whole batch split evenly in the run together) take longer
    # than network.toml's 30 s; it would be struck and dropped. The same in every run here.
    sets = [f"network.min_deadline_seconds={min_deadline_seconds() * slowdown:g}",
            f"train.steps={args.steps}"]
    clusters = []
    try:
        for name, _, b in solos:
            clusters.append(Cluster(args.agora, args.data, name,
                                    ["network.min_peers=1", f"train.batch_size={b}", *sets]))
        for c in clusters:
            c.start_coordinator()
        for c, (_, extra, _) in zip(clusters, solos):
            c.start_peer("peer-0", extra)
        for c in clusters:  # only the coordinators' rows are read: no need to wait for peers
            c.wait_done(timeout=120 + 60 * args.steps, peers=False)
        solo_rows = [c.rows() for c in clusters]
    finally:
        for c in clusters:
            c.close(keep=args.keep)
    # Rates over the window when all four ran in steady state (they end at different times,
    # and one that ran on alone would have the cores to itself); a run with fewer than two
    # finalized steps inside the window is measured over its own steady steps.
    t0 = max(steady(rows)[0]["time"] for rows in solo_rows)
    t1 = min(rows[-1]["time"] for rows in solo_rows)
    solo_tps, windowed = [], []
    for rows in solo_rows:
        inside = [r for r in rows if t0 <= r["time"] <= t1]
        windowed.append(len(inside) >= 2)
        solo_tps.append(tokens_per_second(inside if len(inside) >= 2 else steady(rows)))

    c = Cluster(args.agora, args.data, "together5",
                [f"network.min_peers={normal + 1}", f"train.batch_size={batch}", *sets])
    try:
        c.start_coordinator()
        for i in range(normal):
            c.start_peer(f"peer-{i}")
        c.start_peer("peer-slow", ("--slowdown", str(slowdown)))
        c.wait_done(timeout=120 + 60 * args.steps, peers=False)
        together = tokens_per_second(steady(c.rows()))
    finally:
        c.close(keep=args.keep)
    if together is None or None in solo_tps:
        raise RuntimeError(f"too few finalized steps to time (--steps {args.steps})")
    return {"slowdown": slowdown, "batch_size": batch, "solo_batch_sizes":
            [b for _, _, b in solos], "solo_tokens_per_second": solo_tps,
            "solo_measured_in_common_window": windowed, "solo_window_seconds": max(0.0, t1 - t0),
            "solo_sum_tokens_per_second": sum(solo_tps),
            "run_tokens_per_second": together, "ratio": together / sum(solo_tps)}


def run_join4(args):
    # 16 sequences a holder a step, as `join` (32 over 2).
    return measure_join(args, "join4", holders=4, batch_size=64)


def verify_modes(args):
    """--verify-modes as (label, --set overrides)."""
    rate = f"verify.rate={args.verify_rate}"
    out = []
    for mode in [m.strip() for m in args.verify_modes.split(",") if m.strip()]:
        if mode in ("0", "off"):
            out.append(("rate 0", ["verify.rate=0"]))
        elif mode == "default":
            out.append((f"rate {args.verify_rate}, state_fraction default", [rate]))
        else:
            fraction = 1.0 if mode == "full" else float(mode)
            out.append((f"rate {args.verify_rate}, state_fraction {fraction:g}",
                        [rate, f"verify.state_fraction={fraction:g}"]))
    return out


def run_verify(args):
    """One run per --verify-modes entry; a mode the binary refuses (a key it lacks) is reported
    as such and the others still run."""
    out = {}
    for label, sets in verify_modes(args):
        tag = re.sub(r"[^\w.]+", "-", label)
        try:
            figures, events = measure_utilisation(
                args, f"verify-{tag}", 4, ["network.overlap=1", "train.batch_size=64", *sets])
        except RuntimeError as e:
            print(f"verify, {label}: {e}", file=sys.stderr)
            out[label] = {"sets": sets, "error": str(e)}
            continue
        figures["sets"] = sets
        figures["checks"] = verify_counts(events)
        out[label] = figures
    if all("error" in v for v in out.values()):
        raise RuntimeError("every verify mode failed")
    return out


SCENARIOS = {"utilisation": run_utilisation, "straggler": run_straggler, "join": run_join,
             "harsh": run_harsh, "straggler5": run_straggler5, "join4": run_join4,
             "verify": run_verify}


# --- the table -----------------------------------------------------------------------------------

def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def goal(value, op, bound, text):
    """The goal column: the goal, and whether the value met it."""
    if value is None:
        return text
    met = value >= bound if op == ">=" else value <= bound
    return f"{text} ({'met' if met else 'missed'})"


def utilisation_lines(label, u, bound=None):
    return [(label, "", ""),
            ("  compute utilisation, median / lowest peer",
             f"{pct(u['utilisation_median'])} / {pct(u['utilisation_min'])}",
             "" if bound is None else
             goal(u["utilisation_median"], ">=", bound, f">= {100 * bound:g}%")),
            ("  seconds per step", num(u["seconds_per_step"]), "")]


def join_lines(label, j, bound):
    return [(label, "", ""),
            ("  model bytes / bandwidth (s)", num(j["bytes_over_bandwidth_seconds"], 1), ""),
            ("  round (s)", num(j["round_seconds"]), ""),
            ("  joiner: start to first accepted payload (s)",
             num(j["join_to_first_accepted_seconds"], 1), ""),
            ("  / (1.5 x bytes/bandwidth + one round)", num(j["ratio_to_bound"]),
             goal(j["ratio_to_bound"], "<=", bound, f"<= {bound:g}"))]


def table(results):
    lines = []
    if "utilisation" in results:
        for k in ("overlap0", "overlap1"):
            lines += utilisation_lines(f"4 peers, network.overlap = {k[-1]}",
                                       results["utilisation"][k],
                                       0.95 if k == "overlap1" else None)
    if "straggler" in results:
        s = results["straggler"]
        lines += [("solo tokens/s: normal peer, 3x slower peer",
                   f"{s['solo_fast_tokens_per_second']:.0f}, "
                   f"{s['solo_slow_tokens_per_second']:.0f}",
                   ""),
                  ("run tokens/s with both", f"{s['run_tokens_per_second']:.0f}", ""),
                  ("run / sum of solo", pct(s["ratio"]), goal(s["ratio"], ">=", 0.90, ">= 90%"))]
    if "join" in results:
        lines += join_lines("join, 2 holders", results["join"], 1)
    if "harsh" in results:
        lines += utilisation_lines("harsh: 8 peers, 10 Mbit/s, 200 ms RTT, 2% loss",
                                   results["harsh"], HARSH_GOAL)
    if "straggler5" in results:
        s = results["straggler5"]
        lines += [("straggler5: 3 normal peers and one 5x slower", "", ""),
                  ("  solo tokens/s, the four runs at once",
                   ", ".join(f"{x:.0f}" for x in s["solo_tokens_per_second"]), ""),
                  ("  sum of solo tokens/s", f"{s['solo_sum_tokens_per_second']:.0f}", ""),
                  ("  run tokens/s with the four", f"{s['run_tokens_per_second']:.0f}", ""),
                  ("  run / sum of solo", pct(s["ratio"]), goal(s["ratio"], ">=", 0.95, ">= 95%"))]
    if "join4" in results:
        lines += join_lines("join4, 4 holders", results["join4"], 0.5)
    if "verify" in results:
        base = None
        for label, v in results["verify"].items():
            if "error" in v:
                lines.append((f"verify: 4 peers, overlap 1, {label}", "failed", ""))
                continue
            lines += utilisation_lines(f"verify: 4 peers, overlap 1, {label}", v)
            ch = v["checks"]
            lines.append(("  spot checks drawn / passed / failed / unresolved",
                          f"{ch['drawn']} / {ch['passed']} / {ch['author_failed']} / "
                          f"{ch['unresolved']}", ""))
            if base is None:
                base = v["utilisation_median"]
            elif base:
                lines.append(("  utilisation / the first mode's",
                              pct(v["utilisation_median"] / base), ""))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agora", default="build/apps/agora/agora")
    ap.add_argument("--data", default="data/tokens/sp8k")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--scenario", default="all",
                    help=f"comma-separated: {', '.join(SCENARIOS)}, or all")
    ap.add_argument("--verify-modes", default="0,1,default",
                    help="the verify scenario's runs: 0 (verify.rate 0), 1 (state_fraction 1), "
                         "default (state_fraction not set), or a fraction F (state_fraction F)")
    ap.add_argument("--verify-rate", type=float, default=0.02,
                    help="verify.rate of the verify scenario's runs other than 0 (default 0.02)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    ap.add_argument("--peer-logs", action="store_true",
                    help="peers log every round as JSON lines in NAME.log (with --keep, to "
                         "read where a round's time went: `trained` events carry seconds and "
                         "verify_seconds); by default they run --quiet")
    args = ap.parse_args()
    global PEER_LOGS
    PEER_LOGS = args.peer_logs
    names = [s.strip() for s in args.scenario.split(",") if s.strip()]
    if "all" in names:
        names = list(SCENARIOS)
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names:
        ap.error(f"--scenario: unknown {unknown}; choose from {', '.join(SCENARIOS)} or all")
    if "verify" in names:
        try:
            verify_modes(args)
        except ValueError as e:
            ap.error(f"--verify-modes: {e}")

    results = {"profile": PROFILE, "harsh_profile": HARSH_PROFILE, "steps": args.steps}
    failed = []
    for name in names:
        print(f"[{name}] running ...", flush=True)
        began = time.time()
        try:
            results[name] = SCENARIOS[name](args)
        except Exception as e:  # one scenario's failure leaves the others' figures
            traceback.print_exc()
            failed.append(name)
            results.setdefault("errors", {})[name] = str(e)
        took = time.time() - began
        results.setdefault("wall_seconds", {})[name] = took
        print(f"[{name}] {'failed' if name in failed else 'done'} in {took:.0f} s", flush=True)

    print(f"\nbench/network: links {PROFILE} unless a row says (agora link), small preset, "
          f"DeMo top-k 8 one-bit, {args.steps} steps a run")
    print(f"{'measure':<52} {'value':>16}  goal")
    for measure, value, goal_text in table(results):
        print(f"{measure:<52} {value:>16}  {goal_text}".rstrip())
    for name in failed:
        print(f"{name}: failed: {results['errors'][name]}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
