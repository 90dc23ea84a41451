#!/usr/bin/env python3
"""bench/network/bench_data_fetch: training with data from the run against data on disk.

    bench_data_fetch.py --agora build/apps/agora/agora [--data data/tokens/sp8k] [--steps 12]
                        [--repeats 2] [--json FILE] [--keep]

Runs of the same decentralized job over emulated internet links (bench_network.py's Cluster:
every connection through `agora link`, 20 Mbit/s, 50 ms each way, 1% loss), side by side in one
invocation and alternating, --repeats times each:

  local        4 peers, each with its own copy of the token folder (--data)
  fetch        4 peers with no copy: each fetches the run's data from the coordinator
               (--data-cache, src/agora/serve/data_mount.h, with its background prefetch),
               from the coordinator only (--data-peers 0)
  fetch+peers  the same, members asking each other before the coordinator (the default)
  half         2 peers with a copy, 2 fetching (members first): volunteers joining a run whose
               operators hold the data

Figures: the run's tokens/s (the coordinator's rows: sequences x seq_len over the time from the
first finalized step to the last; the first step is left out, it holds every peer's start), its
ratio fetch / local (issue 40's goal: at least 0.98), the peers' start-to-first-training time,
and the bytes the coordinator sent as data, in all and per step. The run's data is the bundled
7 MB folder: the whole of it reaches each peer during its first steps.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_network import PROFILE, Cluster  # noqa: E402


MODES = ("local", "fetch", "fetch+peers", "half")


class FetchCluster(Cluster):
    def start_peer(self, name, fetch, peers=True):
        """Cluster.start_peer, but a fetching peer gets --data-cache instead of --data."""
        if not fetch:
            return super().start_peer(name)
        saved = self.data
        self.data = None
        try:
            return super().start_peer(name, extra=(
                "--data-cache", os.path.join(self.dir, name + "-data"),
                "--data-peers", "8" if peers else "0"))
        finally:
            self.data = saved


def one(args, mode):
    sets = ["network.min_peers=4", f"train.steps={args.steps}", "train.batch_size=32",
            f'data.dir="{os.path.abspath(args.data)}"']
    c = FetchCluster(args.agora, os.path.abspath(args.data), mode, sets)
    try:
        c.start_coordinator()
        for i in range(4):
            fetch = mode in ("fetch", "fetch+peers") or (mode == "half" and i >= 2)
            c.start_peer(f"peer-{i}", fetch=fetch, peers=(mode != "fetch"))
        c.wait_done(timeout=120 + 40 * args.steps)
        rows = c.rows()
        seq_len = 256  # bench/network/network.toml
        tokens = sum(r["sequences"] for r in rows[1:]) * seq_len
        seconds = rows[-1]["time"] - rows[0]["time"]
        fetched = from_peers = 0
        for i in range(4):
            text = open(os.path.join(c.dir, f"peer-{i}.out")).read()
            m = re.search(r"data fetched ([\d.]+) MiB, ([\d.]+) MiB of it from other members", text)
            if m:
                fetched += float(m.group(1)) * (1 << 20)
                from_peers += float(m.group(2)) * (1 << 20)
        coordinator = fetched - from_peers
        return {"tokens_per_second": tokens / seconds, "steps": len(rows),
                "first_step_seconds": rows[0]["time"] - c.started["peer-0"],
                "data_bytes_fetched": fetched, "data_bytes_from_members": from_peers,
                "data_bytes_from_coordinator": coordinator,
                "coordinator_bytes_per_step": coordinator / max(1, len(rows))}
    finally:
        c.close(keep=args.keep)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agora", default="build/apps/agora/agora")
    ap.add_argument("--data", default="data/tokens/sp8k")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    args = ap.parse_args()
    runs = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES:
            t0 = time.time()
            runs[mode].append(one(args, mode))
            print(f"[{r + 1}/{args.repeats}] {mode}: "
                  f"{runs[mode][-1]['tokens_per_second']:.0f} tokens/s ({time.time() - t0:.0f} s)",
                  file=sys.stderr)
    med = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in runs.items()}
    base = med["local"]["tokens_per_second"]
    print(f"\nbench_data_fetch: 4 peers, links {PROFILE} (agora link), small preset, "
          f"{args.steps} steps, median of {args.repeats}")
    print(f"{'mode':<12} {'tokens/s':>9} {'/ local':>8} {'first step (s)':>15} "
          f"{'fetched MiB':>12} {'from members':>13} {'coordinator MiB/step':>21}")
    for mode in MODES:
        m = med[mode]
        print(f"{mode:<12} {m['tokens_per_second']:>9.0f} {m['tokens_per_second'] / base:>8.3f} "
              f"{m['first_step_seconds']:>15.1f} {m['data_bytes_fetched'] / (1 << 20):>12.1f} "
              f"{m['data_bytes_from_members'] / (1 << 20):>13.1f} "
              f"{m['coordinator_bytes_per_step'] / (1 << 20):>21.2f}")
    ratio = med["fetch+peers"]["tokens_per_second"] / base
    print(f"goal: tokens/s from the run / local >= 0.98 (fetch+peers: {ratio:.3f})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"profile": PROFILE, "steps": args.steps, "runs": runs, "median": med,
                       "ratio": ratio}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
