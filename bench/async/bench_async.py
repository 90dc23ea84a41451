#!/usr/bin/env python3
"""bench/async: synchronous DiLoCo against asynchronous methods among unequal workers.

    bench_async.py --agora build/apps/agora/agora [--config bench/async/async.toml]
                   [--step-times 1,1.3,2.6,5.7] [--rounds 25] [--int8] [--jobs 2]
                   [--methods sync,async,dylu,lookahead,lookahead_discounted] [--out out/async]

A method may name an outer rule other than its published one as METHOD:RULE, for example
async:heloco (HeLoCo's correction with the look-ahead step, 4 workers at a fixed H) or
async:nesterov (the naive per-arrival Nesterov step).

Each method is one `agora async-sim` run (train/async_sim.h): 4 workers whose inner steps take
1 : 1.3 : 2.6 : 5.7 simulated seconds, each training real steps of the config's model on its own
fresh data; the clock is simulated, so the figures do not depend on this machine's load. The run
lasts --rounds synchronous rounds of the slowest worker (rounds x H x 5.7 simulated seconds) for
every method, with a validation once per such round.

The goal (issue 16): the best asynchronous method reaches synchronous DiLoCo's final validation
loss in at most 0.6x synchronous DiLoCo's (simulated) wall time. For each method the table gives
the final loss, the first validation at or below sync's final loss (linearly interpolated between
validations) as a share of sync's time, the tokens trained, the outer updates, the staleness
(updates applied between a worker's pull and its delivery) and the bytes of one delivery.
Writes OUT/async_time.png and OUT/async_tokens.png (gnuplot), the CSV and OUT/bench_async.json.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["sync", "async", "dylu", "lookahead", "lookahead_discounted"]


def run(args, method, horizon, eval_every):
    name, _, rule = method.partition(":")
    cmd = [args.agora, "async-sim", "--config", args.config, "--method", name,
           "--step-times", args.step_times, "--sim-seconds", str(horizon),
           "--eval-every", str(eval_every)]
    if rule:
        cmd += ["--outer-rule", rule]
    if args.int8:
        cmd.append("--int8")
    for s in args.set:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{method} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    curve = [j for j in lines if j["event"] == "eval"]
    summary = [j for j in lines if j["event"] == "summary"][0]
    print(f"  {method}: final val loss {summary['final_val_loss']:.4f} after "
          f"{summary['updates']} updates ({curve[-1]['wall_seconds']:.0f} s here)", flush=True)
    return {"method": method, "curve": curve, "summary": summary}


def time_to(curve, target):
    """The first simulated time the validation loss is at or below `target`, interpolated
    linearly between validations; None when never."""
    for a, b in zip(curve, curve[1:]):
        if b["val_loss"] <= target:
            if a["val_loss"] <= target:
                return a["sim_seconds"]
            f = (a["val_loss"] - target) / (a["val_loss"] - b["val_loss"])
            return a["sim_seconds"] + f * (b["sim_seconds"] - a["sim_seconds"])
    return None


def plot(out, results, x, name, xlabel, title):
    csv = os.path.join(out, f"{name}.csv")
    with open(csv, "w") as f:
        for r in results:
            f.write(f"# {r['method']}\n")
            for p in r["curve"]:
                f.write(f"{p[x]} {p['val_loss']}\n")
            f.write("\n\n")
    lines = ", ".join(f"'{csv}' index {i} with linespoints title '{r['method']}'"
                      for i, r in enumerate(results))
    script = (f"set terminal pngcairo noenhanced size 1000,640 font ',11'\n"
              f"set output '{out}/{name}.png'\n"
              f"set title '{title}'\nset xlabel '{xlabel}'\nset ylabel 'validation loss'\n"
              f"set key top right\nset grid\nplot {lines}\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "async.toml"))
    ap.add_argument("--step-times", default="1,1.3,2.6,5.7")
    ap.add_argument("--inner-steps", type=int, default=10, help="H (diloco.inner_steps)")
    ap.add_argument("--rounds", type=int, default=25,
                    help="the run's length in synchronous rounds of the slowest worker")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--int8", action="store_true", help="pseudo-gradients as int8_rows")
    ap.add_argument("--set", action="append", default=[], help="a run config override")
    ap.add_argument("--jobs", type=int, default=2, help="methods run at once")
    ap.add_argument("--out", default="out/async")
    ap.add_argument("--target-json", help="take sync's final loss from this earlier "
                    "bench_async.json (to run variants without rerunning sync)")
    args = ap.parse_args()
    args.set = [f"diloco.inner_steps={args.inner_steps}", *args.set]
    os.makedirs(args.out, exist_ok=True)
    slowest = max(float(t) for t in args.step_times.split(","))
    round_seconds = args.inner_steps * slowest
    horizon = args.rounds * round_seconds
    methods = args.methods.split(",")
    print(f"{len(methods)} methods, step times {args.step_times}, H = {args.inner_steps}, "
          f"{horizon:g} simulated s ({args.rounds} sync rounds of {round_seconds:g} s)"
          f"{', int8 pseudo-gradients' if args.int8 else ''}", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda m: run(args, m, horizon, round_seconds), methods))
    by = {r["method"]: r for r in results}
    target = by["sync"]["summary"]["final_val_loss"] if "sync" in by else None
    if target is None and args.target_json:
        with open(args.target_json) as f:
            target = json.load(f)["sync_final_val_loss"]
        print(f"sync's final loss {target:.4f} from {args.target_json}")
    rows = []
    print()
    print("| method | final val loss | time to sync's final loss (x sync) | tokens | updates "
          "| staleness mean / max | bytes per delivery |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        s = r["summary"]
        reached = None if target is None else time_to(r["curve"], target)
        share = None if reached is None else reached / horizon
        rows.append({"method": r["method"], "final_val_loss": s["final_val_loss"],
                     "time_to_sync_final": reached, "share_of_sync_time": share,
                     "tokens": s["tokens"], "updates": s["updates"],
                     "staleness_mean": s["staleness_mean"], "staleness_max": s["staleness_max"],
                     "bytes_per_delivery": s["bytes_per_delivery"],
                     "inner_steps": s["inner_steps"]})
        print(f"| {r['method']} | {s['final_val_loss']:.4f} | "
              f"{'never' if share is None else f'{share:.2f}'} | {s['tokens']:,} | "
              f"{s['updates']} | {s['staleness_mean']:.2f} / {s['staleness_max']} | "
              f"{s['bytes_per_delivery']:,.0f} |")
    asyncs = [r for r in rows if r["method"] != "sync" and r["share_of_sync_time"] is not None]
    if asyncs:
        best = min(asyncs, key=lambda r: r["share_of_sync_time"])
        verdict = "meets" if best["share_of_sync_time"] <= 0.6 else "misses"
        print(f"\nbest asynchronous method: {best['method']}, at {best['share_of_sync_time']:.2f}x "
              f"sync's time ({verdict} the 0.6x goal)")
    plot(args.out, results, "sim_seconds", "async_time", "simulated seconds",
         f"validation loss against simulated time (step times {args.step_times}, H {args.inner_steps})")
    plot(args.out, results, "tokens", "async_tokens", "tokens trained",
         f"validation loss against tokens (step times {args.step_times}, H {args.inner_steps})")
    with open(os.path.join(args.out, "bench_async.json"), "w") as f:
        json.dump({"step_times": args.step_times, "inner_steps": args.inner_steps,
                   "horizon_seconds": horizon, "int8": args.int8, "sets": args.set,
                   "sync_final_val_loss": target, "rows": rows,
                   "curves": {r["method"]: r["curve"] for r in results}}, f, indent=2)
    print(f"wrote {args.out}/bench_async.json and the plots", file=sys.stderr)


if __name__ == "__main__":
    main()
