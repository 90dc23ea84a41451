#!/usr/bin/env python3
"""bench/rl: SAPO between machines: four `agora rl sapo-node` processes on loopback.

    bench_sapo_network.py --agora build/apps/agora/agora --checkpoint runs/rl-base/latest
                          [--task arithmetic] [--splits 8/0,4/4] [--rounds 30] [--group 8]
                          [--max-new-tokens 24] [--lr 2e-5] [--temperature 0.7]
                          [--eval-problems 200] [--out out/sapo-network]

For each split I/J, four node processes, each naming the other three as peers: every round a
node samples I groups of its own problems, fetches the others' groups of that round over CURVE
sockets, and trains on its I plus J drawn from the others' informative ones (rl/sapo_node.h).
The figure is the issue's: cumulative reward, the sum over rounds of the mean reward of the
nodes' own samples (the mean over nodes of each node's cumulative reward), and held-out accuracy
before and after. Prints a table and writes OUT/bench_sapo_network.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def keygen(agora, path):
    out = subprocess.run([agora, "keygen", "--out", path], capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1].strip()


def run_split(args, own, shared, port):
    out = os.path.join(args.out, f"sapo_{own}_{shared}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    names = [f"node{i}" for i in range(args.nodes)]
    keys = {n: keygen(args.agora, os.path.join(out, f"{n}.key")) for n in names}
    ports = {n: port + i for i, n in enumerate(names)}
    started = time.time()
    procs = []
    for i, n in enumerate(names):
        peers = []
        for other in names:
            if other != n:
                peers += ["--peer", f"tcp://127.0.0.1:{ports[other]}@{keys[other]}"]
        procs.append(subprocess.Popen(
            [args.agora, "rl", "sapo-node", "--checkpoint", args.checkpoint,
             "--key", os.path.join(out, f"{n}.key"), "--listen", f"tcp://127.0.0.1:{ports[n]}",
             *peers, "--task", args.task, "--rounds", str(args.rounds), "--own", str(own),
             "--shared", str(shared), "--group", str(args.group),
             "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
             "--temperature", str(args.temperature), "--eval-problems", str(args.eval_problems),
             "--seed", str(args.seed + i), "--linger", "20", "--out", os.path.join(out, n)],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, f"{n}.err"), "w")))
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"a node of {own}/{shared} failed; see {out}/*.err")
    summaries = []
    for n in names:
        rows = [json.loads(line) for line in open(os.path.join(out, n, "sapo.jsonl"))]
        summaries.append([r for r in rows if r["event"] == "sapo_node_summary"][0])
    mean = lambda key: sum(s[key] for s in summaries) / len(summaries)  # noqa: E731
    result = {"own": own, "shared": shared, "cumulative_reward": mean("cumulative_reward"),
              "base_accuracy": mean("base_accuracy"), "accuracy": mean("accuracy"),
              "shared_received": sum(s["shared_received"] for s in summaries),
              "shared_used": sum(s["shared_used"] for s in summaries),
              "seconds": time.time() - started, "nodes": summaries}
    print(f"  {own}/{shared}: cumulative reward {result['cumulative_reward']:.2f}, accuracy "
          f"{result['base_accuracy']:.3f} -> {result['accuracy']:.3f} "
          f"({result['seconds']:.0f} s)", flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--splits", default="8/0,4/4")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=7900)
    ap.add_argument("--out", default="out/sapo-network")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"{args.nodes} node processes, {args.rounds} rounds, groups of {args.group}, "
          f"{args.task}", flush=True)
    results = [run_split(args, *map(int, s.split("/")), args.port + 10 * k)
               for k, s in enumerate(args.splits.split(","))]
    print("\n| own / shared | cumulative reward | vs first | held-out accuracy | groups received "
          "/ used | wall time |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        ref = results[0]["cumulative_reward"]
        vs = f"{(r['cumulative_reward'] / ref - 1) * 100:+.1f}%" if ref else "n/a"
        print(f"| {r['own']} / {r['shared']} | {r['cumulative_reward']:.2f} | {vs} | "
              f"{r['base_accuracy']:.3f} -> {r['accuracy']:.3f} | {r['shared_received']} / "
              f"{r['shared_used']} | {r['seconds']:.0f} s |")
    with open(os.path.join(args.out, "bench_sapo_network.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=2)
    print(f"wrote {args.out}/bench_sapo_network.json", file=sys.stderr)


if __name__ == "__main__":
    main()
