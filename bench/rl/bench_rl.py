#!/usr/bin/env python3
"""bench/rl: GRPO from a base model, held-out accuracy against updates and wall time.

    bench_rl.py --agora build/apps/agora/agora --checkpoint runs/rl-base/latest
                [--task arithmetic] [--steps 150] [--prompts 64] [--group 8] [--lr 2e-5]
                [--max-new-tokens 24]
                [--temperature 0.7] [--lags 0,2,4] [--parts lags,workers,sapo] [--reuse]
                [--out out/rl]

--make-base instead of --checkpoint makes a small base in OUT/base first (ctest bench_rl_smoke
runs it so, with runs of two updates: seconds).

Each variant is one `agora rl train` (rl/grpo_trainer.h) from the same base checkpoint with the
same seed, so the variants see the same prompts in the same order:
- policy lag 0, 2, 4 (--lags): rollouts sampled by the policy of k updates ago, what an
  asynchronous run's learner receives; each with the ratio cap (4, for negative advantages) and,
  for the largest lag, once without it (--ratio-cap 0).
- workers: rollouts from simulated workers through the learner's intake and re-scoring
  (rl/worker_sim.h): two honest workers, then the same two with cheaters beside them
  (--cheaters, default other-model, fabricate, replay); the cheaters' rollouts refused, their
  strikes, and the accuracy against the honest-only run.
- SAPO (rl/sapo.h): 4 nodes with their own policies, each round training on I own groups plus
  J groups shared by the others as text, for --sapo-splits (default 8/0, 4/4, 2/6): cumulative
  reward (the sum over rounds of the nodes' mean sampled reward) and held-out accuracy.
Per variant: held-out accuracy (greedy, the first --eval-problems held-out problems) of the base
and at the end, the best along the way, the mean training reward of the last 10% of updates,
rollouts/s, the share of completion tokens clipped and capped. Writes OUT/rl_accuracy.png
(gnuplot; held-out accuracy against updates and against seconds, and the training reward) and
OUT/bench_rl.json.
"""
import argparse
import json
import os
import subprocess
import sys


def make_base(args):
    """A small base model in OUT/base, the way make rl-base makes one (for the smoke test: fewer
    problems and steps)."""
    base = os.path.join(args.out, "base")
    commands = [
        [args.agora, "rl", "corpus", "--task", args.task, "--problems", str(args.base_problems),
         "--out", f"{base}/problems.txt"],
        [args.agora, "tokenizer", "train", "--input", f"{base}/problems.txt", "--vocab-size", "320",
         "--out", f"{base}/tokenizer.model"],
        [args.agora, "tokenize", "--lines", "--tokenizer", f"{base}/tokenizer.model", "--input",
         f"{base}/problems.txt", "--out", f"{base}/tokens", "--val-fraction", "0.05", "--force"],
        [args.agora, "train", "--config", args.base_config, "--quiet",
         "--set", f"data.dir={base}/tokens", "--set", f"train.out_dir={base}/run",
         "--set", f"train.steps={args.base_steps}", "--set", "schedule.warmup_steps=2",
         "--set", "train.eval_interval=0"],
    ]
    for cmd in commands:
        if subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode != 0:
            sys.exit(f"making the base model failed: {' '.join(cmd)}")
    return f"{base}/run/latest"


def run(args, name, extra):
    out = os.path.join(args.out, name)
    cmd = [args.agora, "rl", "train", "--checkpoint", args.checkpoint, "--task", args.task,
           "--steps", str(args.steps), "--prompts", str(args.prompts), "--group", str(args.group),
           "--max-new-tokens", str(args.max_new_tokens),
           "--lr", str(args.lr), "--temperature", str(args.temperature),
           "--eval-interval", str(args.eval_interval), "--eval-problems", str(args.eval_problems),
           "--seed", str(args.seed), "--out", out] + extra
    done = os.path.join(out, "latest", "config.json")
    if args.reuse and os.path.exists(done):
        print(f"== {name}: reusing {out}", file=sys.stderr, flush=True)
    else:
        print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode != 0:
            sys.exit(f"{name}: agora rl train failed ({proc.returncode})")
    all_rows = [json.loads(line) for line in open(os.path.join(out, "rl.jsonl"))]
    rows = [r for r in all_rows if r["event"] == "rl_step"]
    evals = [(r["step"], r["elapsed_s"], r["held_out_accuracy"]) for r in rows
             if "held_out_accuracy" in r]
    steps = [r for r in rows if r["step"] > 0]
    tail = steps[-max(1, len(steps) // 10):]
    last = steps[-1]
    mean = lambda key, rs: sum(r[key] for r in rs) / len(rs)
    intake = [r for r in all_rows if r["event"] == "rl_intake"]
    # The training reward, averaged over windows of 10 updates (one update's is noisy).
    window = 10
    rewards = [(steps[i + window - 1]["step"],
                sum(r["reward"] for r in steps[i:i + window]) / window)
               for i in range(0, len(steps) - window + 1, window)]
    return {"name": name, "extra": extra, "evals": evals, "rewards": rewards,
            "intake": intake[0] if intake else None,
            "base_accuracy": evals[0][2], "final_accuracy": evals[-1][2],
            "best_accuracy": max(e[2] for e in evals),
            "final_reward": mean("reward", tail), "first_reward": mean("reward", steps[:len(tail)]),
            "rollouts_per_second": last["rollouts"] / last["elapsed_s"],
            "seconds": last["elapsed_s"],
            "clipped": mean("clipped_fraction", steps), "capped": mean("capped_fraction", steps)}


def run_sapo(args, own, shared):
    out = os.path.join(args.out, f"sapo_{own}_{shared}")
    cmd = [args.agora, "rl", "sapo", "--checkpoint", args.checkpoint, "--task", args.task,
           "--nodes", "4", "--rounds", str(args.sapo_rounds), "--own", str(own),
           "--shared", str(shared), "--group", str(args.group),
           "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
           "--temperature", str(args.temperature), "--eval-problems", str(args.eval_problems),
           "--seed", str(args.seed), "--out", out]
    print(f"== sapo {own}/{shared}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    if subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode != 0:
        sys.exit(f"sapo {own}/{shared}: agora rl sapo failed")
    rows = [json.loads(line) for line in open(os.path.join(out, "sapo.jsonl"))]
    summary = [r for r in rows if r["event"] == "sapo_summary"][0]
    return {"own": own, "shared": shared, "cumulative_reward": summary["cumulative_reward"],
            "base_accuracy": summary["base_accuracy"], "mean_accuracy": summary["mean_accuracy"],
            "seconds": summary["elapsed_s"],
            "rounds": [(r["round"], r["cumulative_reward"]) for r in rows if r["event"] == "sapo_round"]}


def ratio(value, reference):
    """value / reference as "1.234x", or "n/a" when the reference is 0 (nothing to compare)."""
    return f"{value / reference:.3f}x" if reference else "n/a"


def plot(out, results, title):
    csv = os.path.join(out, "rl_accuracy.csv")
    with open(csv, "w") as f:
        for r in results:
            f.write(f"# {r['name']}\n")
            for step, seconds, acc in r["evals"]:
                f.write(f"{step} {seconds:.2f} {acc:.4f}\n")
            f.write("\n\n")
    by_step = ", ".join(f"'{csv}' index {i} using 1:3 with linespoints lw 2 title '{r['name']}'"
                        for i, r in enumerate(results))
    by_time = ", ".join(f"'{csv}' index {i} using 2:3 with linespoints lw 2 title '{r['name']}'"
                        for i, r in enumerate(results))
    rewards_csv = os.path.join(out, "rl_reward.csv")
    with open(rewards_csv, "w") as f:
        for r in results:
            f.write(f"# {r['name']}\n")
            for step, reward in r["rewards"]:
                f.write(f"{step} {reward:.4f}\n")
            f.write("\n\n")
    by_reward = ", ".join(f"'{rewards_csv}' index {i} using 1:2 with lines lw 2 title '{r['name']}'"
                          for i, r in enumerate(results))
    script = (f"set terminal pngcairo noenhanced size 1500,500 font ',11'\n"
              f"set output '{out}/rl_accuracy.png'\nset multiplot layout 1,3 title '{title}'\n"
              f"set grid\nset key bottom right\nset ylabel 'held-out accuracy (greedy)'\n"
              f"set xlabel 'GRPO updates'\nplot {by_step}\n"
              f"set xlabel 'seconds'\nplot {by_time}\n"
              f"set ylabel 'training reward (mean of 10 updates)'\nset xlabel 'GRPO updates'\n"
              f"plot {by_reward}\nunset multiplot\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--checkpoint", help="the base model (make rl-base)")
    ap.add_argument("--make-base", action="store_true",
                    help="make a small base model in OUT/base instead (the smoke test)")
    ap.add_argument("--base-problems", type=int, default=3000)
    ap.add_argument("--base-steps", type=int, default=6)
    ap.add_argument("--base-config", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "rl-base.toml"))
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24,
                    help="tokens per completion, at most (40 for arithmetic-worked)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--eval-interval", type=int, default=25)
    ap.add_argument("--eval-problems", type=int, default=500)
    ap.add_argument("--lags", default="0,2,4")
    ap.add_argument("--cheaters", default="other-model,fabricate,replay")
    ap.add_argument("--parts", default="lags,workers,sapo", help="which tables to measure")
    ap.add_argument("--sapo-rounds", type=int, default=100)
    ap.add_argument("--sapo-splits", default="8/0,4/4,2/6")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reuse", action="store_true",
                    help="reuse finished runs in --out (re-plot and re-tabulate only)")
    ap.add_argument("--out", default="out/rl")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.make_base:
        args.checkpoint = make_base(args)
    if not args.checkpoint:
        sys.exit("give --checkpoint (a base model: make rl-base) or --make-base")
    parts = args.parts.split(",")
    lags = [int(x) for x in args.lags.split(",")] if "lags" in parts else []
    variants = [(f"lag {k}", ["--policy-lag", str(k)]) for k in lags]
    if lags:
        variants.append((f"lag {lags[-1]}, no ratio cap", ["--policy-lag", str(lags[-1]),
                                                          "--ratio-cap", "0"]))
    results = [run(args, name.replace(" ", "_").replace(",", ""), extra) | {"name": name}
               for name, extra in variants]
    print(f"{args.task}: {args.steps} GRPO updates of {args.prompts} prompts x {args.group} "
          f"completions, lr {args.lr:g}, temperature {args.temperature:g}; held-out accuracy "
          f"greedy on {args.eval_problems} problems\n")
    print("| variant | held-out base | held-out final | best | change (points) | train reward first/last 10% "
          "| rollouts/s | seconds | clipped | capped |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['base_accuracy']:.3f} | {r['final_accuracy']:.3f} | "
              f"{r['best_accuracy']:.3f} | {100 * (r['final_accuracy'] - r['base_accuracy']):+.1f} | "
              f"{r['first_reward']:.3f} / {r['final_reward']:.3f} | {r['rollouts_per_second']:.0f} | "
              f"{r['seconds']:.0f} | {r['clipped']:.4f} | {r['capped']:.4f} |")
    workers = []
    honest = ["--workers", "honest,honest"]
    cheating = ["--workers", "honest,honest," + args.cheaters]
    if "workers" in parts:
        workers = [run(args, "workers_honest", honest) | {"name": "2 honest workers"},
                   run(args, "workers_cheating", cheating) | {"name": f"2 honest + {args.cheaters}"}]
    print("\n| workers | held-out final | change (points) | rollouts refused by verdict | strikes |")
    print("|---|---:|---:|---|---|")
    for r in workers:
        v = r["intake"]["verdicts"]
        refused = ", ".join(f"{k} {n}" for k, n in sorted(v.items()) if n and k != "accepted")
        strikes = ", ".join(f"{k} {n}" for k, n in sorted(r["intake"]["strikes"].items()))
        print(f"| {r['name']} | {r['final_accuracy']:.3f} | "
              f"{100 * (r['final_accuracy'] - r['base_accuracy']):+.1f} | {refused or 'none'} | {strikes} |")
    results += workers
    if results:
        plot(args.out, results, f"GRPO on {args.task}: held-out accuracy")
    sapo = [run_sapo(args, *map(int, split.split("/"))) for split in args.sapo_splits.split(",")
            if "sapo" in parts]
    print(f"\nSAPO, 4 nodes, {args.sapo_rounds} rounds; groups of {args.group}\n")
    print("| own / shared groups | cumulative reward | vs first | held-out base | held-out final (mean of nodes) | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in sapo:
        print(f"| {r['own']} / {r['shared']} | {r['cumulative_reward']:.2f} | "
              f"{ratio(r['cumulative_reward'], sapo[0]['cumulative_reward'])} | "
              f"{r['base_accuracy']:.3f} | {r['mean_accuracy']:.3f} | {r['seconds']:.0f} |")
    with open(os.path.join(args.out, "bench_rl.json"), "w") as f:
        json.dump({"args": vars(args), "rows": results, "sapo": sapo}, f, indent=2)
    print(f"wrote {args.out}/bench_rl.json and {args.out}/rl_accuracy.png", file=sys.stderr)


if __name__ == "__main__":
    main()
