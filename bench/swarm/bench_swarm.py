#!/usr/bin/env python3
"""bench/swarm: routing by throughput against uniform routing, with and without rebalancing.

    bench_swarm.py --agora build/apps/agora/agora [--speeds '1,1,0.333;1,0.333;1,1,0.333']
                   [--kill-every 60] [--rebalance 120] [--minutes 30] [--seeds 5] [--out out/swarm]

Each variant is `agora swarm-sim` (swarm/simulation.h): the issue's swarm of 3 stages whose peers
run at 1x, 1x or 3x slower, a source that keeps 4 micro-batches (of 1 sample) per peer in flight, and a peer
killed every --kill-every seconds (restarted 10 s later, 5 s to load its stage's parameters), on
an event clock with the real router (swarm/router.h) and the coordinator's balancer
(swarm/balance.h). Compute is simulated, so the figures are about routing and balancing alone.

Per variant, medians over --seeds seeds:
- samples/s finished;
- ideal: the sum of the serving replicas' solo throughputs per stage, its minimum over stages
  (the bottleneck) averaged over the run; efficiency = samples/s / ideal (goal: >= 0.9 with
  routing and rebalancing);
- the same samples/s as a share of the first layout's bottleneck (every peer up, nobody moved)
  and of the best assignment of every peer (what rebalancing can reach at most);
- micro-batches lost (a replica and the holder of its input both died), forwards sent again to
  another replica, a stage's forward and backward recomputed on another replica, moves.
The last variant is routing by throughput without the routers' backlog correction (an ablation).
Writes OUT/swarm_timeline.png (gnuplot; samples/s per minute, seed 1), OUT/bench_swarm.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# (routing, rebalancing); "throughput-no-backlog" is routing by throughput without the routers'
# backlog correction (swarm/router.h), an ablation.
VARIANTS = [("throughput", True), ("throughput", False), ("uniform", True), ("uniform", False),
            ("throughput-no-backlog", True)]


def run(args, routing, rebalance, seed):
    cmd = [args.agora, "swarm-sim", "--speeds", args.speeds, "--kill-every", str(args.kill_every),
           "--sim-seconds", str(args.minutes * 60), "--seed", str(seed), "--window", "60"]
    if routing == "uniform":
        cmd.append("--uniform")
    if routing == "throughput-no-backlog":
        cmd.append("--no-backlog")
    if rebalance:
        cmd += ["--rebalance", str(args.rebalance)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"windows": [j for j in lines if j["event"] == "window"],
            "summary": [j for j in lines if j["event"] == "summary"][0]}


def plot(out, results, title):
    csv = os.path.join(out, "swarm_timeline.csv")
    with open(csv, "w") as f:
        for r in results:
            f.write(f"# {r['name']}\n")
            for w in r["runs"][0]["windows"]:
                f.write(f"{w['sim_seconds'] / 60:g} {w['samples_per_second']:.5f} {w['ideal']:.5f}\n")
            f.write("\n\n")
    lines = [f"'{csv}' index {i} using 1:2 with lines lw 2 title '{r['name']}'"
             for i, r in enumerate(results)]
    lines.append(f"'{csv}' index 0 using 1:3 with lines dt 2 lc rgb 'black' "
                 f"title 'ideal ({results[0]['name']})'")
    script = (f"set terminal pngcairo noenhanced size 1000,600 font ',11'\n"
              f"set output '{out}/swarm_timeline.png'\nset title '{title}'\n"
              f"set xlabel 'simulated minutes'\nset ylabel 'samples per second'\n"
              f"set key bottom right\nset grid\nset yrange [0:*]\nplot {', '.join(lines)}\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--speeds", default="1,1,0.3333333333;1,0.3333333333;1,1,0.3333333333")
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--rebalance", type=float, default=120, help="T, seconds between moves")
    ap.add_argument("--minutes", type=float, default=30, help="simulated length")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/swarm")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    jobs = [(routing, rebalance, seed) for routing, rebalance in VARIANTS
            for seed in range(1, args.seeds + 1)]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda j: run(args, *j), jobs))
    results = []
    for routing, rebalance in VARIANTS:
        runs = [r for j, r in zip(jobs, done) if j[0] == routing and j[1] == rebalance]
        name = f"{routing} routing, {'rebalancing every %gs' % args.rebalance if rebalance else 'no rebalancing'}"
        med = lambda k: statistics.median(r["summary"][k] for r in runs)
        first = runs[0]["summary"]
        results.append({
            "name": name, "routing": routing, "rebalance": rebalance, "runs": runs,
            "samples_per_second": med("samples_per_second"), "ideal": med("ideal"),
            "efficiency": med("efficiency"),
            "of_initial": med("samples_per_second") / first["initial_bottleneck"],
            "of_best": med("samples_per_second") / first["best_bottleneck"],
            "lost": med("lost"), "retries": med("retries"), "recomputed": med("recomputed"),
            "moves": med("moves"),
            "kills": med("kills")})
    first = results[0]["runs"][0]["summary"]
    print(f"speeds per stage {args.speeds}; a kill every {args.kill_every:g} s; {args.minutes:g} "
          f"simulated minutes; medians of {args.seeds} seeds")
    print(f"first layout's bottleneck {first['initial_bottleneck']:.4f} samples/s, best "
          f"assignment {first['best_bottleneck']:.4f}\n")
    print("| routing | rebalancing | samples/s | ideal (serving bottleneck) | efficiency "
          "| of first layout | of best assignment | lost | retried | recomputed | moves |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['routing']} | {'every %gs' % args.rebalance if r['rebalance'] else 'no'} | "
              f"{r['samples_per_second']:.4f} | {r['ideal']:.4f} | {r['efficiency']:.3f} | "
              f"{r['of_initial']:.3f} | {r['of_best']:.3f} | {r['lost']:g} | {r['retries']:g} | "
              f"{r['recomputed']:g} | {r['moves']:g} |")
    by = {(r["routing"], r["rebalance"]): r for r in results}
    best = by[("throughput", True)]
    gain = best["samples_per_second"] / by[("uniform", True)]["samples_per_second"]
    print(f"\nrouting by throughput with rebalancing: {best['efficiency']:.1%} of the ideal "
          f"({'meets' if best['efficiency'] >= 0.9 else 'misses'} the 90% goal), "
          f"{gain:.2f}x uniform routing's samples/s")
    plot(args.out, results, f"swarm samples/s per minute (speeds {args.speeds}, a kill every "
                            f"{args.kill_every:g} s, seed 1)")
    with open(os.path.join(args.out, "bench_swarm.json"), "w") as f:
        json.dump({"speeds": args.speeds, "kill_every": args.kill_every,
                   "rebalance": args.rebalance, "minutes": args.minutes, "seeds": args.seeds,
                   "initial_bottleneck": first["initial_bottleneck"],
                   "best_bottleneck": first["best_bottleneck"],
                   "rows": [{k: v for k, v in r.items() if k != "runs"} for r in results],
                   "timelines": {r["name"]: r["runs"][0]["windows"] for r in results}},
                  f, indent=2)
    print(f"wrote {args.out}/bench_swarm.json and {args.out}/swarm_timeline.png", file=sys.stderr)


if __name__ == "__main__":
    main()
