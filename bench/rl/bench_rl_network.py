#!/usr/bin/env python3
"""RL across the network against RL in one process: what the network roles cost and catch.

    bench_rl_network.py --agora build/apps/agora/agora --checkpoint runs/rl-base/latest

Runs, on the same base model and settings (docs/rl.md section 7):
  - `agora rl train`: the learner samples its own rollouts, in one process (the reference);
  - `agora rl serve` with 1 and 2 honest `agora rl work` processes on loopback;
  - `agora rl serve` with 2 honest workers and the cheaters (--cheaters, one process each).
and prints a table: held-out accuracy before and after, wall time, rollouts per second, the
policy bytes a worker received per update (int8 deltas) against the float32 model, and for the
cheaters how many of their rollouts were accepted and when each was banned. Writes
OUT/bench_rl_network.json and OUT/rl_network.png (held-out accuracy against seconds).

On one machine the learner and the workers share its cores, so the network runs measure the
protocol's overhead, not a speed-up: a worker on another machine adds its own cores.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_rl import make_base  # noqa: E402


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def common(args):
    return ["--task", args.task, "--steps", str(args.steps), "--prompts", str(args.prompts),
            "--group", str(args.group), "--lr", str(args.lr), "--temperature",
            str(args.temperature), "--eval-interval", str(args.eval_interval),
            "--eval-problems", str(args.eval_problems)]


def learner_rows(path):
    rows = [e for e in events(path) if e["event"] == "rl_step"]
    evals = [(r["step"], r["elapsed_s"], r["held_out_accuracy"]) for r in rows
             if "held_out_accuracy" in r]
    return rows, evals


def in_process(args):
    out = os.path.join(args.out, "in_process")
    cmd = [args.agora, "rl", "train", "--checkpoint", args.checkpoint, "--seed", str(args.seed),
           "--out", out] + common(args)
    print(f"== in process: {' '.join(cmd)}", file=sys.stderr, flush=True)
    started = time.time()
    if subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode != 0:
        sys.exit("agora rl train failed")
    rows, evals = learner_rows(os.path.join(out, "rl.jsonl"))
    return {"name": "one process (rl train)", "workers": 0, "evals": evals,
            "seconds": time.time() - started, "rollouts": rows[-1]["rollouts"]}


def networked(args, name, behaviours):
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    keys = {}
    for who in ["learner"] + [f"w{i}" for i in range(len(behaviours))]:
        path = os.path.join(out, f"{who}.key")
        if os.path.exists(path):
            os.remove(path)
        keys[who] = subprocess.run([args.agora, "keygen", "--out", path], check=True,
                                   capture_output=True, text=True).stdout.split()[-1]
    log = os.path.join(out, "learner", "rl.jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = [args.agora, "rl", "serve", "--checkpoint", args.checkpoint, "--key",
           os.path.join(out, "learner.key"), "--listen", "tcp://127.0.0.1:*",
           "--open", "--out", os.path.join(out, "learner")] + common(args)
    print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    started = time.time()
    learner = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    workers = []
    try:
        hello = None
        while hello is None and learner.poll() is None:
            hello = next((e for e in events(log) if e["event"] == "rl_learner"), None)
            time.sleep(0.1)
        if hello is None:
            sys.exit(f"{name}: the learner stopped before it listened")
        for i, behave in enumerate(behaviours):
            workers.append(subprocess.Popen(
                [args.agora, "rl", "work", "--key", os.path.join(out, f"w{i}.key"),
                 "--learner", hello["listen"], "--learner-key", keys["learner"],
                 "--base", args.checkpoint, "--behave", behave,
                 "--log", os.path.join(out, f"w{i}.jsonl")],
                stdout=open(os.path.join(out, f"w{i}.out"), "w"), stderr=subprocess.STDOUT))
        # A learner whose workers all died would wait for rollouts forever.
        while learner.poll() is None:
            if all(w.poll() not in (None, 0) for w in workers):
                learner.kill()
                sys.exit(f"{name}: every worker failed; see {out}/w*.out")
            time.sleep(0.2)
        if learner.returncode != 0:
            sys.exit(f"{name}: agora rl serve failed")
        for w in workers:
            w.wait(timeout=120)
    finally:
        for p in [learner, *workers]:
            if p.poll() is None:
                p.kill()
    seconds = time.time() - started
    rows, evals = learner_rows(log)
    all_events = events(log)
    intake = next(e for e in all_events if e["event"] == "rl_intake")
    banned_at = {e["worker"]: e["elapsed_s"] for e in all_events
                 if e["event"] == "rl_worker" and e["state"] == "banned"}
    per_worker = []
    for i, behave in enumerate(behaviours):
        worker_events = events(os.path.join(out, f"w{i}.jsonl"))
        done = next((e for e in worker_events if e["event"] == "rl_worker_done"), {})
        deltas = [e["bytes"] for e in worker_events
                  if e["event"] == "rl_worker_policy" and not e["whole"]]
        per_worker.append({
            "behaviour": behave, "key": keys[f"w{i}"],
            "submitted": done.get("submitted", 0),
            "accepted": done.get("receipts", {}).get("accepted", 0),
            "strikes": intake["strikes"].get(keys[f"w{i}"], 0),
            "banned_at_s": banned_at.get(keys[f"w{i}"]),
            "hash_mismatches": done.get("hash_mismatches", 0),
            "delta_bytes": sorted(deltas)[len(deltas) // 2] if deltas else 0})
    return {"name": name, "workers": len(behaviours), "evals": evals, "seconds": seconds,
            "rollouts": rows[-1]["rollouts"], "verdicts": intake["verdicts"],
            "per_worker": per_worker}


def plot(out, results):
    csv = os.path.join(out, "rl_network.csv")
    with open(csv, "w") as f:
        for r in results:
            f.write(f"# {r['name']}\n")
            for step, seconds, acc in r["evals"]:
                f.write(f"{step} {seconds:.2f} {acc:.4f}\n")
            f.write("\n\n")
    lines = ", ".join(f"'{csv}' index {i} using 2:3 with linespoints lw 2 title '{r['name']}'"
                      for i, r in enumerate(results))
    script = (f"set terminal pngcairo noenhanced size 900,500 font ',11'\n"
              f"set output '{out}/rl_network.png'\nset grid\nset key bottom right\n"
              f"set title 'GRPO in one process and across processes (one 2-core machine)'\n"
              f"set xlabel 'seconds'\nset ylabel 'held-out accuracy (greedy)'\nplot {lines}\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--checkpoint", help="the base model (make rl-base)")
    ap.add_argument("--make-base", action="store_true", help="make a small base in OUT/base")
    ap.add_argument("--base-problems", type=int, default=3000)
    ap.add_argument("--base-steps", type=int, default=6)
    ap.add_argument("--base-config", default=os.path.join(HERE, "..", "..", "configs",
                                                          "rl-base.toml"))
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--eval-interval", type=int, default=10)
    ap.add_argument("--eval-problems", type=int, default=500)
    ap.add_argument("--workers", default="1,2", help="honest worker counts to run")
    ap.add_argument("--cheaters", default="other-model,fabricate,replay",
                    help="run 2 honest workers and these cheaters (empty: skip)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="out/rl_network")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.make_base:
        args.checkpoint = make_base(args)
    if not args.checkpoint:
        sys.exit("give --checkpoint (a base model: make rl-base) or --make-base")
    model_bytes = os.path.getsize(os.path.join(args.checkpoint, "model.safetensors"))

    results = [in_process(args)]
    for n in [int(x) for x in args.workers.split(",") if x]:
        results.append(networked(args, f"{n} honest worker{'s' if n > 1 else ''}",
                                 ["honest"] * n))
    cheaters = [c for c in args.cheaters.split(",") if c]
    if cheaters:
        results.append(networked(args, "2 honest + " + ", ".join(cheaters),
                                 ["honest", "honest"] + cheaters))

    print(f"{args.task}: {args.steps} GRPO updates of {args.prompts} prompts x {args.group}, "
          f"lr {args.lr:g}; held-out accuracy greedy on {args.eval_problems} problems; "
          f"float32 model {model_bytes / 1e6:.2f} MB\n")
    print("| run | held-out base | held-out final | change (points) | seconds | rollouts/s "
          "| policy bytes per update per worker |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        base, final = r["evals"][0][2], r["evals"][-1][2]
        deltas = [w["delta_bytes"] for w in r.get("per_worker", []) if w["delta_bytes"]]
        per_update = (f"{deltas[0] / 1e6:.2f} MB ({deltas[0] / model_bytes:.3f}x float32)"
                      if deltas else "-")
        print(f"| {r['name']} | {base:.3f} | {final:.3f} | {100 * (final - base):+.1f} | "
              f"{r['seconds']:.0f} | {r['rollouts'] / r['seconds']:.0f} | {per_update} |")
    for r in results:
        if not any(w["behaviour"] != "honest" for w in r.get("per_worker", [])):
            continue
        print(f"\n{r['name']}: rollouts by verdict {r['verdicts']}\n")
        print("| worker | submitted | accepted | strikes | banned after (s) | hash mismatches |")
        print("|---|---:|---:|---:|---:|---:|")
        for w in r["per_worker"]:
            banned = f"{w['banned_at_s']:.1f}" if w["banned_at_s"] is not None else "no"
            print(f"| {w['behaviour']} | {w['submitted']} | {w['accepted']} | {w['strikes']} | "
                  f"{banned} | {w['hash_mismatches']} |")
    with open(os.path.join(args.out, "bench_rl_network.json"), "w") as f:
        json.dump({"args": vars(args), "model_bytes": model_bytes, "results": results}, f,
                  indent=1)
    plot(args.out, results)


if __name__ == "__main__":
    main()
