#!/usr/bin/env python3
"""bench/network/bench_data_fetch: training with data from the run against data on disk.

    bench_data_fetch.py --agora build/apps/agora/agora [--data data/tokens/sp8k] [--steps 12]
                        [--repeats 2] [--json FILE] [--keep]

Two runs of the same decentralized job over emulated internet links (bench_network.py's
Cluster: every connection through `agora link`, 20 Mbit/s, 50 ms each way, 1% loss), side by
side in one invocation and alternating, --repeats times each:

  local   4 peers, each with its own copy of the token folder (--data)
  fetch   4 peers with no copy: each fetches the run's data from the coordinator
          (--data-cache, src/agora/serve/data_mount.h), with the background prefetch

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


class FetchCluster(Cluster):
    def start_peer(self, name, fetch):
        """Cluster.start_peer, but a fetching peer gets --data-cache instead of --data."""
        if not fetch:
            return super().start_peer(name)
        saved = self.data
        self.data = None
        try:
            return super().start_peer(name, extra=("--data-cache", os.path.join(self.dir, name + "-data")))
        finally:
            self.data = saved


def one(args, mode):
    sets = ["network.min_peers=4", f"train.steps={args.steps}", "train.batch_size=32",
            f'data.dir="{os.path.abspath(args.data)}"']
    c = FetchCluster(args.agora, os.path.abspath(args.data), mode, sets)
    try:
        c.start_coordinator()
        for i in range(4):
            c.start_peer(f"peer-{i}", fetch=(mode == "fetch"))
        c.wait_done(timeout=120 + 40 * args.steps)
        rows = c.rows()
        seq_len = 256  # bench/network/network.toml
        tokens = sum(r["sequences"] for r in rows[1:]) * seq_len
        seconds = rows[-1]["time"] - rows[0]["time"]
        fetched = 0
        for i in range(4):
            text = open(os.path.join(c.dir, f"peer-{i}.out")).read()
            m = re.search(r"data fetched ([\d.]+) MiB", text)
            fetched += float(m.group(1)) * (1 << 20) if m else 0
        return {"tokens_per_second": tokens / seconds, "steps": len(rows),
                "first_step_seconds": rows[0]["time"] - c.started["peer-0"],
                "data_bytes_sent": fetched, "data_bytes_per_step": fetched / max(1, len(rows))}
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
    runs = {"local": [], "fetch": []}
    for r in range(args.repeats):
        for mode in ("local", "fetch"):
            t0 = time.time()
            runs[mode].append(one(args, mode))
            print(f"[{r + 1}/{args.repeats}] {mode}: "
                  f"{runs[mode][-1]['tokens_per_second']:.0f} tokens/s ({time.time() - t0:.0f} s)",
                  file=sys.stderr)
    med = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in runs.items()}
    ratio = med["fetch"]["tokens_per_second"] / med["local"]["tokens_per_second"]
    print(f"\nbench_data_fetch: 4 peers, links {PROFILE} (agora link), small preset, "
          f"{args.steps} steps, median of {args.repeats}")
    print(f"{'':<34} {'local copy':>12} {'from the run':>14}")
    print(f"{'tokens/s (steps 2..)':<34} {med['local']['tokens_per_second']:>12.0f} "
          f"{med['fetch']['tokens_per_second']:>14.0f}")
    print(f"{'start to first final step (s)':<34} {med['local']['first_step_seconds']:>12.1f} "
          f"{med['fetch']['first_step_seconds']:>14.1f}")
    print(f"{'data the coordinator sent (MiB)':<34} {0:>12.1f} "
          f"{med['fetch']['data_bytes_sent'] / (1 << 20):>14.1f}")
    print(f"{'  per step (MiB)':<34} {0:>12.1f} "
          f"{med['fetch']['data_bytes_per_step'] / (1 << 20):>14.2f}")
    print(f"{'tokens/s ratio, from the run / local':<34} {ratio:>12.3f}   goal >= 0.98")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"profile": PROFILE, "steps": args.steps, "runs": runs, "median": med,
                       "ratio": ratio}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
