#!/usr/bin/env python3
"""bench/poisoning across real processes: one hostile member of eight in the swarm and in the
asynchronous run, against the clean run (issue 38). bench_poisoning (C++) gives the same figures
for the data-parallel core, in one process.

    bench_poisoning_network.py --agora build/apps/agora/agora [--roles swarm,async]
                               [--swarm-attacks sign_flip,scale,zero,garbage]
                               [--async-attacks sign_flip,scaled,zero,noise,tiny,claim]
                               [--swarm-steps 30] [--async-seconds 60] [--clean-runs 2]
                               [--async-method lookahead]
                               [--out out/poisoning-net]

The swarm: `agora swarm serve` and eight `agora swarm peer` processes, configs/swarm.toml cut
into 2 stages of 4 replicas, --swarm-steps steps; the hostile member is the last replica of stage
1 (`--behave`, swarm_peer.h):
  sign_flip, scale, zero  its round contribution's values negated, times 1e6, or 0 (what DeMo's
                          bound on influence and the coordinator's checks see);
  garbage                 every backward it returns to stage 0 is the honest gradient negated
                          and times 100 (routed work, which nobody checks).
At the end one honest replica's stage files per stage are merged (agora merge-stages) and
evaluated on --eval-windows windows of the validation set.

The asynchronous run: `agora async serve --method lookahead` (the asynchronous method that
trains best here, docs/results.md; asynchronous DiLoCo with Nesterov per arrival at outer lr 0.7
diverges with eight workers even when all are honest: val loss 37.3 in 60 s) and eight
`agora async work` processes of equal speed (each inner step padded to --unit seconds), for
--async-seconds; the hostile worker (`--behave`, async_worker.h):
  sign_flip, scaled, zero, noise  trains honestly and delivers -D, 1000 x D, 0, or Gaussian
                                  values as large as D's;
  tiny                            trains nothing and delivers 1e-6 everywhere, at once;
  claim                           never fetches parameters and says it holds the newest.
The server validates theta at the end (the run's final loss).

The clean run goes --clean-runs times, so the table shows how far two clean runs land apart on
this machine (routing and the wall clock are not deterministic): an attack is "held" when its
final loss is at most the clean runs' mean plus the tolerance, 2% or the clean runs' own spread
(largest minus smallest, over the mean) where that is wider, and no honest member was struck. Per row: final validation loss, its distance to
the clean mean, who was struck or banned (the hostile member only, if the roles work), the
steps or updates done. Writes OUT/bench_poisoning_network.json.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELD_WITHIN = 0.02


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def keygen(agora, path):
    return run([agora, "keygen", "--out", path]).strip().splitlines()[-1].strip()


def wait_for_event(log, name, proc, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = next((e for e in events(log) if e["event"] == name), None)
        if found:
            return found
        if proc.poll() is not None:
            sys.exit(f"FAILED: the server exited before '{name}'; see {os.path.dirname(log)}")
        time.sleep(0.05)
    sys.exit(f"FAILED: no '{name}' within {seconds} s in {log}")


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def swarm_run(args, name, attack):
    out = os.path.join(args.out, "swarm", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    config = os.path.join(ROOT, "configs", "swarm.toml")
    sets = ["--set", f"data.dir={args.data}", "--set", f"train.steps={args.swarm_steps}",
            "--set", "pipeline.stages=2"]
    roles = [(f"s{s}r{r}", s) for s in (0, 1) for r in range(4)]
    hostile = roles[-1][0] if attack else None
    keys = {n: keygen(args.agora, f"{out}/{n}.key") for n in ["coordinator"] + [n for n, _ in roles]}
    started = time.time()
    coordinator = subprocess.Popen(
        [args.agora, "swarm", "serve", "--config", config, *sets,
         "--key", f"{out}/coordinator.key", "--listen", "tcp://127.0.0.1:*", "--open",
         "--peers", str(len(roles)), "--http", "off", "--out", f"{out}/coordinator"],
        stdout=open(f"{out}/coordinator.out", "w"), stderr=subprocess.STDOUT)
    log = f"{out}/coordinator/events.jsonl"
    peers = {}
    try:
        serve = wait_for_event(log, "swarm_serve", coordinator, 60)
        for n, stage in roles:
            behave = ["--behave", attack] if n == hostile else []
            peers[n] = subprocess.Popen(
                [args.agora, "swarm", "peer", "--config", config, *sets, "--key", f"{out}/{n}.key",
                 "--coordinator", serve["listen"], "--coordinator-key", keys["coordinator"],
                 "--listen", "tcp://127.0.0.1:*", "--stage", str(stage), "--events",
                 f"{out}/{n}.jsonl", "--out", f"{out}/stage-{n}", *behave],
                stdout=open(f"{out}/{n}.out", "w"), stderr=subprocess.STDOUT)
        if coordinator.wait(timeout=args.timeout) != 0:
            sys.exit(f"FAILED: the swarm coordinator of {name} failed; see {out}")
        for n, p in peers.items():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
    except subprocess.TimeoutExpired:
        sys.exit(f"FAILED: the swarm run {name} did not finish within {args.timeout} s; see {out}")
    finally:
        stop([coordinator, *peers.values()])
    log_events = events(log)
    summary = next(e for e in log_events if e["event"] == "swarm_summary")
    merged = f"{out}/merged-stages"
    os.makedirs(merged)
    for n in ("s0r0", "s1r0"):
        for f in os.listdir(f"{out}/stage-{n}"):
            shutil.copy(f"{out}/stage-{n}/{f}", merged)
    run([args.agora, "merge-stages", "--config", config, *sets, "--stages", merged,
         "--out", f"{out}/checkpoint"])
    evaluated = json.loads(run([args.agora, "eval", "--checkpoint", f"{out}/checkpoint", "--data",
                                f"{args.data}/val_000000.bin", "--max-windows",
                                str(args.eval_windows), "--json"]))
    short = {keys[n][:8]: n for n, _ in roles}
    struck = sorted({short.get(e["peer"], e["peer"]) for e in log_events
                     if e["event"] == "swarm_struck"})
    banned = sorted({short.get(e["peer"], e["peer"]) for e in log_events
                     if e["event"] == "swarm_banned"})
    row = {"role": "swarm", "attack": attack or "clean", "hostile": hostile,
           "val_loss": evaluated["val_loss"], "steps": summary["steps"], "struck": struck,
           "banned": banned, "seconds": time.time() - started}
    print(f"  swarm {name}: val loss {row['val_loss']:.4f} after {row['steps']} steps, struck "
          f"{struck}, banned {banned} ({row['seconds']:.0f} s)", flush=True)
    return row


def async_run(args, name, attack):
    out = os.path.join(args.out, "async", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    config = os.path.join(ROOT, "bench", "async", "async.toml")
    sets = ["--set", f"data.dir={args.data}", "--set", f"diloco.inner_steps={args.inner_steps}",
            "--set", f"diloco.outer_lr={args.async_outer_lr}"]
    names = [f"w{i}" for i in range(8)]
    hostile = names[-1] if attack else None
    server_pub = keygen(args.agora, f"{out}/server.key")
    keys = {n: keygen(args.agora, f"{out}/{n}.key") for n in names}
    started = time.time()
    server = subprocess.Popen(
        [args.agora, "async", "serve", "--config", config, *sets, "--key", f"{out}/server.key",
         "--listen", "tcp://127.0.0.1:*", "--open", "--method", args.async_method, "--workers",
         str(len(names)), "--seconds", str(args.async_seconds), "--eval-every",
         str(args.async_seconds), "--eval-windows", str(args.eval_windows), "--http", "off",
         "--out", out],
        stdout=open(f"{out}/server.out", "w"), stderr=subprocess.STDOUT)
    log = f"{out}/events.jsonl"
    workers = []
    try:
        start = wait_for_event(log, "async_start", server, 60)
        for n in names:
            behave = ["--behave", attack] if n == hostile else []
            workers.append(subprocess.Popen(
                [args.agora, "async", "work", "--config", config, *sets, "--key", f"{out}/{n}.key",
                 "--server", start["listen"], "--server-key", server_pub, "--step-seconds",
                 str(args.unit), "--log", f"{out}/{n}.jsonl", *behave],
                stdout=subprocess.DEVNULL, stderr=open(f"{out}/{n}.err", "w")))
        if server.wait(timeout=args.timeout) != 0:
            sys.exit(f"FAILED: the async server of {name} failed; see {out}/server.out")
    except subprocess.TimeoutExpired:
        sys.exit(f"FAILED: the async run {name} did not finish within {args.timeout} s; see {out}")
    finally:
        stop([server, *workers])
    log_events = events(log)
    summary = next(e for e in log_events if e["event"] == "async_summary")
    by_key = {k: n for n, k in keys.items()}
    struck = sorted({by_key.get(e["worker"], e["worker"]) for e in log_events
                     if e["event"] == "async_delivery" and e.get("verdict") not in
                     (None, "accepted", "stale")})
    banned = sorted(by_key.get(k, k) for k in summary["banned"])
    row = {"role": "async", "attack": attack or "clean", "hostile": hostile,
           "val_loss": summary["final_val_loss"], "updates": summary["updates"],
           "verdicts": summary["verdicts"], "struck": struck, "banned": banned,
           "seconds": time.time() - started}
    print(f"  async {name}: val loss {row['val_loss']:.4f} after {row['updates']} updates, "
          f"verdicts {summary['verdicts']}, banned {banned} ({row['seconds']:.0f} s)", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "tokens", "sp8k"))
    ap.add_argument("--roles", default="swarm,async")
    ap.add_argument("--swarm-attacks", default="sign_flip,scale,zero,garbage")
    ap.add_argument("--async-attacks", default="sign_flip,scaled,zero,noise,tiny,claim")
    ap.add_argument("--swarm-steps", type=int, default=30)
    ap.add_argument("--async-seconds", type=float, default=60)
    ap.add_argument("--async-method", default="lookahead",
                    help="async: the server's --method (async, dylu, lookahead, ...)")
    ap.add_argument("--async-outer-lr", type=float, default=0.35,
                    help="async: the outer learning rate (bench/async's 0.7 is for four workers; "
                    "eight deliver twice as often)")
    ap.add_argument("--unit", type=float, default=0.3, help="async: seconds per inner step")
    ap.add_argument("--inner-steps", type=int, default=10, help="async: H")
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--clean-runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    ap.add_argument("--out", default="out/poisoning-net")
    args = ap.parse_args()
    args.data = os.path.abspath(args.data)
    os.makedirs(args.out, exist_ok=True)
    roles = [r for r in args.roles.split(",") if r]
    for r in roles:
        if r not in ("swarm", "async"):
            sys.exit(f"--roles: '{r}' is not a role here (allowed: swarm, async)")

    results = {}
    for role in roles:
        one = swarm_run if role == "swarm" else async_run
        attacks = (args.swarm_attacks if role == "swarm" else args.async_attacks).split(",")
        print(f"{role}: {args.clean_runs} clean runs and {len(attacks)} attacks", flush=True)
        clean = [one(args, f"clean{i}", None) for i in range(args.clean_runs)]
        rows = [one(args, a, a) for a in attacks if a]
        losses = [r["val_loss"] for r in clean]
        mean = statistics.mean(losses)
        tolerance = max(HELD_WITHIN, (max(losses) - min(losses)) / mean)
        for r in clean + rows:
            r["vs_clean_percent"] = 100 * (r["val_loss"] - mean) / mean
            honest_struck = [n for n in r["struck"] + r["banned"] if n != r["hostile"]]
            r["honest_struck"] = sorted(set(honest_struck))
            r["held"] = r["vs_clean_percent"] <= 100 * tolerance and not honest_struck
        results[role] = {"clean_mean_val_loss": mean, "tolerance_percent": 100 * tolerance,
                         "clean": clean, "attacks": rows}
        print(f"{role}: held within +{100 * tolerance:.2f}% of the clean mean {mean:.4f}",
              flush=True)

    print()
    print("| role | attack | final val loss | vs clean mean | hostile struck / banned "
          "| honest struck | work done | held |")
    print("|---|---|---:|---:|---|---|---:|---|")
    for role, res in results.items():
        for r in res["clean"] + res["attacks"]:
            hostile = ("-" if not r["hostile"] else
                       f"{'yes' if r['hostile'] in r['struck'] else 'no'} / "
                       f"{'yes' if r['hostile'] in r['banned'] else 'no'}")
            done = f"{r['steps']} steps" if role == "swarm" else f"{r['updates']} updates"
            print(f"| {role} | {r['attack']} | {r['val_loss']:.4f} | "
                  f"{r['vs_clean_percent']:+.2f}% | {hostile} | "
                  f"{', '.join(r['honest_struck']) or 'none'} | {done} | "
                  f"{'yes' if r['held'] else 'NO'} |")
    path = os.path.join(args.out, "bench_poisoning_network.json")
    with open(path, "w") as f:
        json.dump({"swarm_steps": args.swarm_steps, "async_seconds": args.async_seconds,
                   "async_method": args.async_method, "async_outer_lr": args.async_outer_lr,
                   "unit": args.unit, "inner_steps": args.inner_steps,
                   "eval_windows": args.eval_windows, "held_within": HELD_WITHIN,
                   "results": results}, f, indent=2)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
