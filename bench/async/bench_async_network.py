#!/usr/bin/env python3
"""bench/async: asynchronous data parallelism across real processes (docs/async.md).

    bench_async_network.py --agora build/apps/agora/agora [--config bench/async/async.toml]
                           [--step-times 1,1.3,2.6,5.7] [--unit 0.5] [--rounds 10]
                           [--methods sync,lookahead,lookahead_discounted,dylu] [--f32]
                           [--out out/async-net]

For each method, one `agora async serve` and one `agora async work` process per worker, over
CURVE sockets on loopback. Worker w pads each inner step to unit x step_times[w] seconds
(--step-seconds), so the workers keep the issue's 1 : 1.3 : 2.6 : 5.7 speeds whatever this
machine's cores do, as long as a step's compute fits in the fastest worker's time (each worker's
log says how much of its time it computed; the table prints the fastest's share). Every method
runs for the wall time synchronous DiLoCo takes for --rounds rounds of the slowest worker, and
the server validates copies of theta taken once per such round, after the run.

The table: final validation loss, the time at which the loss first reaches sync's final loss
(interpolated between validations) as a share of the run, tokens, outer updates, staleness,
deliveries refused, bytes per delivery. Writes OUT/async_net_time.png, OUT/async_net_tokens.png
(gnuplot), the CSV and OUT/bench_async_network.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_async import plot, time_to  # noqa: E402


def keygen(agora, path):
    out = subprocess.run([agora, "keygen", "--out", path], capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1].strip()


def run(args, method, port, seconds, eval_every, times):
    out = os.path.join(args.out, method)
    shutil.rmtree(out, ignore_errors=True)  # keygen will not overwrite a key
    os.makedirs(out)
    server_pub = keygen(args.agora, os.path.join(out, "server.key"))
    endpoint = f"tcp://127.0.0.1:{port}"
    sets = []
    for s in args.set:
        sets += ["--set", s]
    server = subprocess.Popen(
        [args.agora, "async", "serve", "--config", args.config, *sets,
         "--key", os.path.join(out, "server.key"), "--listen", endpoint, "--open", "--method", method,
         "--workers", str(len(times)), "--seconds", str(seconds),
         "--eval-every", str(eval_every), "--out", out] + (["--f32"] if args.f32 else []),
        stdout=subprocess.PIPE, stderr=open(os.path.join(out, "server.err"), "w"), text=True)
    workers = []
    for w, t in enumerate(times):
        key = os.path.join(out, f"worker{w}.key")
        keygen(args.agora, key)
        workers.append(subprocess.Popen(
            [args.agora, "async", "work", "--config", args.config, *sets, "--key", key,
             "--server", endpoint, "--server-key", server_pub,
             "--step-seconds", str(args.unit * t), "--log", os.path.join(out, f"worker{w}.jsonl")],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, f"worker{w}.err"), "w")))
    started = time.time()
    stdout, _ = server.communicate()
    # A worker in the middle of a round when the run ended would wait for its idle timeout.
    for p in workers:
        p.terminate()
        p.wait()
    if server.returncode != 0:
        sys.exit(f"{method}: the server failed ({server.returncode}); see {out}/server.err")
    events = [json.loads(line) for line in open(os.path.join(out, "events.jsonl"))]
    curve = [e for e in events if e["event"] == "async_eval"]
    summary = [e for e in events if e["event"] == "async_summary"][0]
    done = [json.loads(line) for line in open(os.path.join(out, "worker0.jsonl"))
            if '"async_worker_done"' in line]
    busy = None
    if done:
        busy = done[0]["compute_seconds"] / max(1e-9, done[0]["elapsed_s"])
    print(f"  {method}: final val loss {summary['final_val_loss']:.4f} after "
          f"{summary['updates']} updates ({time.time() - started:.0f} s)", flush=True)
    return {"method": method, "curve": curve, "summary": summary, "fastest_busy": busy}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "async.toml"))
    ap.add_argument("--step-times", default="1,1.3,2.6,5.7")
    ap.add_argument("--unit", type=float, default=0.5, help="seconds of the fastest worker's step")
    ap.add_argument("--inner-steps", type=int, default=10, help="H (diloco.inner_steps)")
    ap.add_argument("--rounds", type=int, default=10,
                    help="the run's length in synchronous rounds of the slowest worker")
    ap.add_argument("--methods", default="sync,lookahead,lookahead_discounted,dylu")
    ap.add_argument("--f32", action="store_true", help="pseudo-gradients as float32")
    ap.add_argument("--set", action="append", default=[], help="a run config override")
    ap.add_argument("--port", type=int, default=7790)
    ap.add_argument("--out", default="out/async-net")
    args = ap.parse_args()
    args.set = [f"diloco.inner_steps={args.inner_steps}", *args.set]
    os.makedirs(args.out, exist_ok=True)
    times = [float(t) for t in args.step_times.split(",")]
    round_seconds = args.inner_steps * args.unit * max(times)
    horizon = args.rounds * round_seconds
    methods = args.methods.split(",")
    print(f"{len(methods)} methods, {len(times)} worker processes with steps of "
          f"{', '.join(f'{args.unit * t:g}' for t in times)} s, H = {args.inner_steps}, "
          f"{horizon:g} s each ({args.rounds} sync rounds of {round_seconds:g} s)", flush=True)
    results = [run(args, m, args.port + i, horizon, round_seconds, times)
               for i, m in enumerate(methods)]
    by = {r["method"]: r for r in results}
    target = by["sync"]["summary"]["final_val_loss"] if "sync" in by else None
    rows = []
    print()
    print("| method | final val loss | time to sync's final loss (x sync) | tokens | updates "
          "| staleness mean / max | refused | bytes per delivery | fastest worker computing |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        s = r["summary"]
        reached = None if target is None else time_to(
            [{"sim_seconds": p["seconds"], "val_loss": p["val_loss"]} for p in r["curve"]], target)
        share = None if reached is None else reached / horizon
        refused = sum(n for v, n in s["verdicts"].items() if v != "accepted")
        rows.append({"method": r["method"], "final_val_loss": s["final_val_loss"],
                     "time_to_sync_final": reached, "share_of_sync_time": share,
                     "tokens": s["tokens"], "updates": s["updates"],
                     "staleness_mean": s["staleness_mean"], "staleness_max": s["staleness_max"],
                     "verdicts": s["verdicts"], "bytes_per_delivery": s["bytes_per_delivery"],
                     "fastest_busy": r["fastest_busy"]})
        busy = "?" if r["fastest_busy"] is None else f"{100 * r['fastest_busy']:.0f}%"
        print(f"| {r['method']} | {s['final_val_loss']:.4f} | "
              f"{'never' if share is None else f'{share:.2f}'} | {s['tokens']:,} | "
              f"{s['updates']} | {s['staleness_mean']:.2f} / {s['staleness_max']} | {refused} | "
              f"{s['bytes_per_delivery']:,.0f} | {busy} |")
    asyncs = [r for r in rows if r["method"] != "sync" and r["share_of_sync_time"] is not None]
    if asyncs:
        best = min(asyncs, key=lambda r: r["share_of_sync_time"])
        verdict = "meets" if best["share_of_sync_time"] <= 0.6 else "misses"
        print(f"\nbest asynchronous method: {best['method']}, at {best['share_of_sync_time']:.2f}x "
              f"sync's time ({verdict} the 0.6x goal)")
    for r in results:
        r["curve"] = [dict(p, sim_seconds=p["seconds"]) for p in r["curve"]]
    plot(args.out, results, "sim_seconds", "async_net_time", "seconds (wall clock)",
         f"validation loss against time, real processes (steps {args.step_times} x {args.unit} s)")
    plot(args.out, results, "tokens", "async_net_tokens", "tokens trained",
         f"validation loss against tokens, real processes (steps {args.step_times} x {args.unit} s)")
    with open(os.path.join(args.out, "bench_async_network.json"), "w") as f:
        json.dump({"step_times": args.step_times, "unit": args.unit,
                   "inner_steps": args.inner_steps, "horizon_seconds": horizon,
                   "int8": not args.f32, "sets": args.set, "sync_final_val_loss": target,
                   "rows": rows, "curves": {r["method"]: r["curve"] for r in results}}, f, indent=2)
    print(f"wrote {args.out}/bench_async_network.json and the plots", file=sys.stderr)


if __name__ == "__main__":
    main()
