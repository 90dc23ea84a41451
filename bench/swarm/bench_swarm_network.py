#!/usr/bin/env python3
"""bench/swarm: the swarm as real processes (docs/swarm.md section 4): routing by throughput
against uniform routing, with and without rebalancing, under a kill every --kill-every seconds.

    bench_swarm_network.py --agora build/apps/agora/agora [--seconds 150] [--kill-every 50]
                           [--speeds '1,1,0.333;1,0.333;1,1,0.333'] [--pace-unit 0.05]
                           [--rebalance 40] [--out out/swarm-net]

Per variant: `agora swarm serve` and one `agora swarm peer` per speed in --speeds (stages split
by ';'), on loopback, with configs/swarm.toml at train.batch_size --batch (micro-batches of 2,
each stage-0 replica keeping --in-flight of them going).
Each peer plays a machine of its speed: a sample's forward and backward on its stage take at
least --pace-unit / speed seconds (swarm_peer.h; every stage costs the same, --costs 1,1,1).
Every --kill-every seconds one peer is SIGKILLed (chosen by --seed among the peers of stages that
keep another) and started again --restart seconds later, without its state: on its own stage,
or where the coordinator puts it when rebalancing is on; it fetches the stage's parameters from a
replica. After --seconds the coordinator and the peers are stopped.

Printed and written to OUT/bench_swarm_network.json, per variant:
- samples/s: samples of finished steps per second, from the first step to the stop;
- ideal: the coordinator's, the sum of the serving replicas' measured solo throughputs per stage
  (1 / seconds per sample of forward and backward), its minimum over stages (the bottleneck),
  averaged over the run; efficiency = samples/s / ideal (the issue's goal: >= 0.9 with routing
  and rebalancing);
- the same samples/s against the first layout's bottleneck (every peer up on its first stage,
  from the pace) and against the best assignment of the peers (what rebalancing can reach);
- steps, peers lost, micro-batches sent again, moves, seconds the run waited.
OUT/swarm_net_timeline.png (gnuplot): samples/s per 10 s window, per variant.
"""
import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

VARIANTS = [("throughput", True), ("uniform", True), ("throughput", False), ("uniform", False)]


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def status(url):
    try:
        with urllib.request.urlopen(url + "/api/swarm", timeout=2) as r:
            return json.loads(r.read().decode())
    except (OSError, ValueError):
        return None


def bottleneck(layout, pace):
    """Samples/s of the slowest stage, each stage serving at the sum of its peers' speeds."""
    return min(sum(speeds) / pace for speeds in layout) if all(layout) else 0.0


def best_assignment(speeds, stages, pace):
    best = 0.0
    for assignment in itertools.product(range(stages), repeat=len(speeds)):
        layout = [[s for s, a in zip(speeds, assignment) if a == t] for t in range(stages)]
        best = max(best, bottleneck(layout, pace))
    return best


def run_variant(args, name, routing, rebalance, layout, keys, out):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    stages = len(layout)
    peers_spec = [(f"p{i}", s, speed) for i, (s, speed) in
                  enumerate((s, v) for s, speeds in enumerate(layout) for v in speeds)]
    sets = ["--set", f"data.dir={args.data}", "--set", "train.steps=100000",
            "--set", f"train.batch_size={args.batch}", "--set", "train.micro_batch_size=2",
            "--set", f"pipeline.micro_batches={args.batch // 2}",
            "--set", f"pipeline.stages={stages}", "--set", f"model.num_layers={stages}"]
    costs = ",".join(["1"] * stages)
    serve_cmd = [args.agora, "swarm", "serve", "--config", args.config, *sets,
                 "--key", keys["coordinator"], "--listen", "tcp://127.0.0.1:*", "--open",
                 "--peers", str(len(peers_spec)), "--peer-timeout", "3", "--http", "127.0.0.1:0",
                 "--costs", costs, "--out", f"{out}/coordinator"]
    if rebalance:
        serve_cmd += ["--rebalance", str(args.rebalance)]
    coordinator = subprocess.Popen(serve_cmd, stdout=open(f"{out}/coordinator.out", "w"),
                                   stderr=subprocess.STDOUT)
    log = f"{out}/coordinator/events.jsonl"
    deadline = time.time() + 60
    serve = http = None
    while time.time() < deadline and not (serve and http):
        ev = events(log)
        serve = next((e for e in ev if e["event"] == "swarm_serve"), None)
        http = next((e["url"] for e in ev if e["event"] == "swarm_http"), None)
        time.sleep(0.1)
    if not (serve and http):
        coordinator.kill()
        sys.exit(f"{name}: the coordinator did not start; see {out}/coordinator.out")
    procs, stage_of, speed_of = {}, {}, {}

    def start(peer, stage):
        cmd = [args.agora, "swarm", "peer", "--config", args.config, *sets,
               "--key", keys[peer], "--coordinator", serve["listen"],
               "--coordinator-key", serve["key"], "--listen", "tcp://127.0.0.1:*",
               "--stage", str(stage), "--speed", str(speed_of[peer]),
               "--pace-unit", str(args.pace_unit), "--costs", costs, "--timeout", "10",
               "--in-flight", str(args.in_flight),
               "--events", f"{out}/{peer}.jsonl"]
        if routing == "uniform":
            cmd.append("--uniform")
        procs[peer] = subprocess.Popen(cmd, stdout=open(f"{out}/{peer}.out", "a"),
                                       stderr=subprocess.STDOUT)

    for peer, stage, speed in peers_spec:
        stage_of[peer], speed_of[peer] = stage, speed
        start(peer, stage)
    rng = random.Random(args.seed)
    short = {}
    for peer, _, _ in peers_spec:
        with open(keys[peer]) as f:
            short[json.load(f)["public"][:8]] = peer
    began = None
    kills, restarts = [], []
    while True:
        if coordinator.poll() is not None:
            sys.exit(f"{name}: the coordinator exited; see {out}/coordinator.out")
        if began is None:
            if any(e["event"] == "swarm_start" for e in events(log)):
                began = time.time()
            time.sleep(0.1)
            continue
        now = time.time() - began
        if now >= args.seconds:
            break
        for when, peer in list(restarts):
            if now >= when:
                restarts.remove((when, peer))
                start(peer, -1 if rebalance else stage_of[peer])
        if args.kill_every > 0 and now >= (len(kills) + 1) * args.kill_every:
            s = status(http)
            if s:
                live = [(short[r["peer"]], st["stage"]) for st in s["stages"]
                        for r in st["replicas"] if len(st["replicas"]) > 1]
                live = [(p, st) for p, st in live if procs[p].poll() is None]
                if live:
                    peer, stage = rng.choice(sorted(live))
                    procs[peer].send_signal(signal.SIGKILL)
                    procs[peer].wait()
                    stage_of[peer] = stage
                    kills.append({"at": now, "peer": peer, "stage": stage})
                    restarts.append((now + args.restart, peer))
        time.sleep(0.1)
    coordinator.send_signal(signal.SIGINT)
    try:
        coordinator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        coordinator.kill()
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs.values():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    ev = events(log)
    summary = [e for e in ev if e["event"] == "swarm_summary"][-1]
    steps = [e for e in ev if e["event"] == "swarm_step"]
    timeline, window, last = [], 10.0, (0.0, 0)
    for e in steps:
        if e["elapsed"] - last[0] >= window:
            timeline.append((e["elapsed"], (e["samples"] - last[1]) / (e["elapsed"] - last[0])))
            last = (e["elapsed"], e["samples"])
    return {"name": name, "routing": routing, "rebalance": rebalance, "summary": summary,
            "kills": kills, "timeline": timeline,
            "moves": [e for e in ev if e["event"] == "swarm_move"]}


def plot(out, results, title):
    csv = os.path.join(out, "swarm_net_timeline.csv")
    with open(csv, "w") as f:
        for r in results:
            f.write(f"# {r['name']}\n")
            for t, rate in r["timeline"]:
                f.write(f"{t:.2f} {rate:.4f}\n")
            f.write("\n\n")
    lines = [f"'{csv}' index {i} using 1:2 with linespoints lw 2 title '{r['name']}'"
             for i, r in enumerate(results)]
    script = (f"set terminal pngcairo noenhanced size 1000,600 font ',11'\n"
              f"set output '{out}/swarm_net_timeline.png'\nset title '{title}'\n"
              f"set xlabel 'seconds'\nset ylabel 'samples per second (10 s windows)'\n"
              f"set key bottom right\nset grid\nset yrange [0:*]\nplot {', '.join(lines)}\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agora", default=os.path.join(root, "build/apps/agora/agora"))
    p.add_argument("--config", default=os.path.join(root, "configs/swarm.toml"))
    p.add_argument("--data", default=os.path.join(root, "data/tokens/sp8k"))
    p.add_argument("--speeds", default="1,1,0.333;1,0.333;1,1,0.333")
    p.add_argument("--pace-unit", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--in-flight", type=int, default=10,
                   help="micro-batches each stage-0 replica keeps in flight (the simulation's "
                        "source keeps 4 per peer: 32 for 8 peers)")
    p.add_argument("--seconds", type=float, default=150)
    p.add_argument("--kill-every", type=float, default=50)
    p.add_argument("--restart", type=float, default=10)
    p.add_argument("--rebalance", type=float, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants", default="all",
                   help="comma-separated names, e.g. throughput+rebalance,uniform+rebalance")
    p.add_argument("--out", default="out/swarm-net")
    args = p.parse_args()
    layout = [[float(x) for x in stage.split(",")] for stage in args.speeds.split(";")]
    os.makedirs(args.out, exist_ok=True)
    keys = {}
    for name in ["coordinator"] + [f"p{i}" for i in range(sum(map(len, layout)))]:
        path = os.path.join(args.out, f"{name}.key")
        if not os.path.exists(path):
            subprocess.run([args.agora, "keygen", "--out", path], check=True,
                           capture_output=True)
        keys[name] = path
    results = []
    for routing, rebalance in VARIANTS:
        name = f"{routing}{'+rebalance' if rebalance else ''}"
        if args.variants != "all" and name not in args.variants.split(","):
            continue
        print(f"{name}: {args.seconds:g} s ...", file=sys.stderr, flush=True)
        results.append(run_variant(args, name, routing, rebalance, layout, keys,
                                   os.path.join(args.out, name)))
    first = bottleneck(layout, args.pace_unit)
    best = best_assignment([v for s in layout for v in s], len(layout), args.pace_unit)
    print(f"\nswarm {args.speeds}, pace {args.pace_unit} s/sample at speed 1, kill every "
          f"{args.kill_every:g} s, {args.seconds:g} s per variant; first layout's bottleneck "
          f"{first:.2f} samples/s, best assignment's {best:.2f}")
    print(f"{'variant':<24}{'samples/s':>10}{'ideal':>8}{'eff.':>7}{'/first':>8}{'/best':>7}"
          f"{'steps':>7}{'lost':>6}{'resent':>8}{'moves':>7}{'waited':>8}")
    for r in results:
        s = r["summary"]
        print(f"{r['name']:<24}{s['samples_per_second']:>10.2f}"
              f"{s['ideal_samples_per_second']:>8.2f}{s['efficiency']:>7.2f}"
              f"{s['samples_per_second'] / first:>8.2f}{s['samples_per_second'] / best:>7.2f}"
              f"{s['steps']:>7}{s['lost']:>6}{s['retried']:>8}{s['moves']:>7}"
              f"{s['waiting_seconds']:>8.1f}")
    by = {r["name"]: r["summary"]["samples_per_second"] for r in results}
    for a, b in (("throughput+rebalance", "uniform+rebalance"), ("throughput", "uniform"),
                 ("throughput+rebalance", "throughput")):
        if a in by and b in by and by[b] > 0:
            print(f"{a} / {b}: {by[a] / by[b]:.2f}x")
    with open(os.path.join(args.out, "bench_swarm_network.json"), "w") as f:
        json.dump({"speeds": args.speeds, "pace_unit": args.pace_unit, "batch": args.batch,
                   "seconds": args.seconds, "kill_every": args.kill_every,
                   "rebalance": args.rebalance, "first_bottleneck": first,
                   "best_bottleneck": best, "results": results}, f, indent=1)
    plot(args.out, results, f"swarm across processes: {args.speeds}, a kill every "
         f"{args.kill_every:g} s")


if __name__ == "__main__":
    main()
