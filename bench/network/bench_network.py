#!/usr/bin/env python3
"""bench/network: a decentralized run over emulated internet links, side by side.

    bench_network.py --agora build/apps/agora/agora [--data data/tokens/sp8k] [--json FILE]
                     [--steps N] [--scenario utilisation|straggler|join|all]

Every process is real (a coordinator, peers, CURVE over ZeroMQ); every connection goes through
`agora link`, the user-space link shaper (this kernel has no netem), so each link has the
bandwidth, delay, jitter and loss of the profile. A peer reaches the coordinator through a
shaper in front of the coordinator's port, and other peers reach it through a shaper in front of
its own port (--advertise), so fetches cross a shaped link too. Each connection is shaped on its
own: a peer's uplink is not shared among the peers downloading from it.

Scenarios (issue 5's figures):
  utilisation  4 peers at 20 Mbit/s, 50 ms each way (100 ms round trip), 1% loss, with
               network.overlap 0 and 1: each peer's time computing / wall time (median of peers).
  straggler    one peer 3x slower (--slowdown 3): the run's tokens/s against the sum of each
               peer's tokens/s training alone on the same links.
  join         a peer joins a running 2-peer run: its time from start to its first payload in a
               finalized set, against model bytes / link bandwidth (+ one round).
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

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "network.toml")
PROFILE = "rate=20mbit,delay=50ms,jitter=5ms,loss=1%"
RATE_BITS = 20e6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, agora, data, name, sets, profile=PROFILE):
        self.agora, self.data, self.profile = agora, data, profile
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
                f"tcp://127.0.0.1:{public}", "--threads", "1", "--quiet", *extra]
        self.started[name] = time.time()
        p = subprocess.Popen(args, stdout=open(os.path.join(self.dir, name + ".out"), "w"),
                             stderr=open(os.path.join(self.dir, name + ".log"), "w"))
        self.peers[name] = (p, key)
        self.procs.append(p)
        return key

    def rows(self):
        rows = []
        for line in open(os.path.join(self.dir, "coordinator.jsonl")):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("event") == "step":
                rows.append(j)
        return rows

    def wait_steps(self, n, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if len(self.rows()) >= n:
                return
            if self.coordinator.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{len(self.rows())} of {n} steps after {timeout} s; logs in {self.dir}")

    def wait_done(self, timeout):
        self.coordinator.wait(timeout=timeout)
        for p, _ in self.peers.values():
            p.wait(timeout=60)

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
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_utilisation(args):
    out = {}
    for overlap in (0, 1):
        c = Cluster(args.agora, args.data, f"util{overlap}",
                    [f"network.overlap={overlap}", "network.min_peers=4",
                     f"train.steps={args.steps}", "train.batch_size=64"])
        try:
            c.start_coordinator()
            for i in range(4):
                c.start_peer(f"peer-{i}")
            c.wait_done(timeout=60 + 30 * args.steps)
            ratios = []
            for i in range(4):
                compute, wall = c.summary(f"peer-{i}")
                ratios.append(compute / wall)
            rows = c.rows()
            round_s = (rows[-1]["time"] - rows[1]["time"]) / max(1, len(rows) - 2)
            out[f"overlap{overlap}"] = {"utilisation_median": statistics.median(ratios),
                                        "utilisation_per_peer": ratios,
                                        "seconds_per_step": round_s}
        finally:
            c.close(keep=args.keep)
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
    c = Cluster(args.agora, args.data, "join",
                ["network.min_peers=2", f"train.steps={max(args.steps, 40)}",
                 "train.batch_size=32"])
    try:
        c.start_coordinator()
        c.start_peer("peer-0")
        c.start_peer("peer-1")
        c.wait_steps(8, timeout=600)
        key = c.start_peer("joiner")
        short = key[:8]
        began = c.started["joiner"]
        accepted = None
        end = time.time() + 900
        while accepted is None and time.time() < end:
            for r in c.rows():
                if short in r.get("authors", []):
                    accepted = r["time"]
                    break
            time.sleep(0.2)
        rows = c.rows()
        round_s = statistics.median(b["time"] - a["time"] for a, b in zip(rows[2:], rows[3:]))
        c.wait_done(timeout=900)
    finally:
        c.close(keep=args.keep)
    if accepted is None:
        raise RuntimeError("the joiner's payload was never accepted")
    model_bytes = rows[-1]["allreduce_bytes"]  # 4 bytes per parameter: the fp32 model
    transfer = model_bytes * 8 / RATE_BITS
    took = accepted - began
    return {"model_bytes": model_bytes, "link_bits_per_second": RATE_BITS,
            "bytes_over_bandwidth_seconds": transfer, "round_seconds": round_s,
            "join_to_first_accepted_seconds": took,
            "ratio_to_bound": took / (1.5 * transfer + round_s)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agora", default="build/apps/agora/agora")
    ap.add_argument("--data", default="data/tokens/sp8k")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--scenario", default="all", choices=["all", "utilisation", "straggler", "join"])
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    args = ap.parse_args()
    results = {"profile": PROFILE, "steps": args.steps}
    if args.scenario in ("all", "utilisation"):
        results["utilisation"] = run_utilisation(args)
    if args.scenario in ("all", "straggler"):
        results["straggler"] = run_straggler(args)
    if args.scenario in ("all", "join"):
        results["join"] = run_join(args)

    print(f"\nbench/network: links {PROFILE} (agora link), small preset, DeMo top-k 8 one-bit")
    print(f"{'measure':<52} {'value':>12}  goal")
    if "utilisation" in results:
        for k in ("overlap0", "overlap1"):
            u = results["utilisation"][k]
            goal = ">= 95%" if k == "overlap1" else ""
            print(f"{'compute utilisation, 4 peers, network.' + k.replace('overlap', 'overlap = '):<52}"
                  f" {100 * u['utilisation_median']:>11.1f}%  {goal}")
            print(f"{'  seconds per step':<52} {u['seconds_per_step']:>12.2f}")
    if "straggler" in results:
        s = results["straggler"]
        print(f"{'solo tokens/s: normal peer, 3x slower peer':<52} "
              f"{s['solo_fast_tokens_per_second']:>5.0f}, {s['solo_slow_tokens_per_second']:>5.0f}")
        print(f"{'run tokens/s with both':<52} {s['run_tokens_per_second']:>12.0f}")
        print(f"{'run / sum of solo':<52} {100 * s['ratio']:>11.1f}%  >= 90%")
    if "join" in results:
        j = results["join"]
        print(f"{'model bytes / bandwidth (s)':<52} {j['bytes_over_bandwidth_seconds']:>12.1f}")
        print(f"{'round (s)':<52} {j['round_seconds']:>12.2f}")
        print(f"{'joiner: start to first accepted payload (s)':<52} "
              f"{j['join_to_first_accepted_seconds']:>12.1f}")
        print(f"{'  / (1.5 x bytes/bandwidth + one round)':<52} {j['ratio_to_bound']:>12.2f}  <= 1")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
