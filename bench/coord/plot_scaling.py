#!/usr/bin/env python3
"""bench/coord: the scaling curves of docs/scaling.md from the load test's and the simulation's
JSON (bench_coordinator_load.py --out, agora_coord_sim --json).

    plot_scaling.py --load out/coord-load/bench_coordinator_load.json
                    --sim out/coord-load/coord_sim.json [--sim-wan out/coord-load/coord_sim_wan.json]
                    [--sim-wan-before OLD.json] --out docs/img/coord_scaling.png

Two panels against members (log scales): what the coordinator sends per round (MB), and round
seconds, each for the load test (processes on this machine) and the simulations.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def rows(path, key_n, key_bytes, key_round):
    if not path or not os.path.exists(path):
        return []
    data = json.load(open(path))["results"]
    return [(r[key_n], (r.get(key_bytes) or 0) / 1e6, r.get(key_round) or 0) for r in data
            if r.get(key_round) and r[key_round] > 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--sim-wan")
    ap.add_argument("--sim-wan-before", help="the same simulation at an earlier commit")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    series = [("load test (processes, loopback)",
               rows(args.load, "members", "coordinator_bytes_sent_per_round",
                    "round_seconds_median")),
              ("simulation, loopback-like links",
               rows(args.sim, "members", "coordinator_bytes_per_round", "round_seconds")),
              ("simulation, 1 Gbit/s coordinator, 100 Mbit/s members",
               rows(args.sim_wan, "members", "coordinator_bytes_per_round", "round_seconds")),
              ("the same, before shared broadcasts and witness bits",
               rows(args.sim_wan_before, "members", "coordinator_bytes_per_round",
                    "round_seconds"))]
    series = [(name, pts) for name, pts in series if pts]
    tmp = tempfile.mkdtemp(prefix="agora-plot-")
    files = []
    for i, (name, pts) in enumerate(series):
        path = os.path.join(tmp, f"s{i}.dat")
        with open(path, "w") as f:
            for n, mb, sec in pts:
                f.write(f"{n} {mb} {sec}\n")
        files.append((name, path))
    plot_bytes = ", ".join(f"'{p}' using 1:2 with linespoints title '{n}'" for n, p in files)
    plot_round = ", ".join(f"'{p}' using 1:3 with linespoints title '{n}'" for n, p in files)
    script = f"""
set terminal pngcairo size 1200,480 font ',10'
set output '{args.out}'
set multiplot layout 1,2
set logscale xy
set grid
set key top left
set xlabel 'members'
set ylabel 'MB the coordinator sends per round'
plot {plot_bytes}
set ylabel 'round seconds (RoundStart to the last Finalized)'
plot {plot_round}
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?)", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
