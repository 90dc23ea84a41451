#!/usr/bin/env python3
"""bench/verify: what spot checks cost a run, and how fast they catch a lazy member.

    bench_spot_checks.py --agora build/apps/agora/agora [--data data/tokens/sp8k] [--json FILE]
                         [--steps N] [--repeats K] [--scenario overhead|detection|all]
                         [--rates 0,0.02,0.05,0.25] [--peers 4] [--pin] [--cheats a,b]
                         [--set key=value ...] [--skip N]

Real processes on loopback (a coordinator and peers of the integration tests' tiny run,
tests/integration/network.toml, with data.seq_len --seq-len), side by side in one invocation:

  overhead   the same run at each of --rates (the first is the baseline), each --repeats times
             in turn: the run's tokens/s (sequences x seq_len over the wall time from the
             --skip-th to the last finalized step), every process's CPU seconds per 1,000
             tokens (less moved by machine noise than wall time), the checks resolved per round,
             the verifier's seconds per recomputation, a share's training seconds and the
             per-step bookkeeping. With
             --pin, peer i is pinned to core i (taskset): each peer has a core of its own, as
             peers on machines of their own do, and its checks take its own time; without it
             --peers peers share every core and a check on one slows all of them.
  detection  for each of --cheats, one peer of 4 cheats (AGORA_TEST_CHEAT: half_batch trains
             half its share, other_data other sequences, and commits as if it trained its share)
             at verify.rate 0.25 with verify.max_failures high enough that it stays in the run:
             the share of its contributions drawn, the share of drawn checks that confirmed the
             failure, and from them the chance to be caught within R rounds, 1 - (1 - p d)^R,
             against 1 - (1 - rate)^R; the honest verdicts' margins (lowest overlap, highest
             momentum error) and false positives. Peers run at --slowdown 2 (a peer waiting on
             slower hardware leaves the CPU to its verifier).

The machine has 2 cores; the verifier thread runs at nice 5 beside training. The ratios, not the
absolute rates, are the result.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from network_run import Run  # noqa: E402

PEERS = 4


def one_run(args, name, rate, steps, cheater=None, extra=(), sets=(), peers=PEERS, pin=False,
            cheat="half_batch"):
    run = Run(args.agora, args.data, name, peers=peers, steps=steps,
              sets=[f"network.min_peers={peers - (1 if cheater is not None else 0)}",
                    f"verify.rate={rate}", f"data.seq_len={args.seq_len}", *args.set, *sets])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.start_coordinator()
    cores = os.cpu_count() or 1
    for i in range(peers):
        env = {"AGORA_TEST_CHEAT": cheat} if i == cheater else None
        prefix = ("taskset", "-c", str(i % cores)) if pin else ()
        run.start_peer(i, extra=extra, env=env, prefix=prefix)
    run.wait_finished(timeout=900)
    # Every process of the run has been waited for: their CPU time is in RUSAGE_CHILDREN.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = run.rows()
    steps_rows = run.steps_final(rows)
    verify = [r for r in run.log_rows("verify", rows=rows)]
    verdicts = [e for i in range(peers) for e in run.events(i, "verdict")]
    trained = [e for i in range(peers) for e in run.events(i, "trained")]
    out = {"rows": steps_rows, "verify": verify, "cpu_seconds": cpu, "verdicts": verdicts, "keys": run.peer_keys,
           "train_seconds": [e["seconds"] for e in trained],
           "bookkeeping_seconds": [e.get("verify_seconds", 0.0) for e in trained]}
    if args.keep:
        print(f"  logs kept in {run.dir}")
    else:
        run.cleanup()
    return out


def tokens_per_second(result, seq_len, skip):
    """Steady state: from the skip-th finalized step to the last (joins and warm-up excluded)."""
    rows = result["rows"][skip:]
    if len(rows) < 2:
        return 0.0
    seqs = sum(r["sequences"] for r in rows[1:])
    return seqs * seq_len / (rows[-1]["time"] - rows[0]["time"])


def cpu_per_kilotoken(result, seq_len):
    """Every process's CPU seconds (coordinator, peers, start-up included) per 1,000 tokens."""
    tokens = sum(r["sequences"] for r in result["rows"]) * seq_len
    return 1000 * result["cpu_seconds"] / tokens if tokens else 0.0


def run_overhead(args):
    rates = args.rates
    seq_len = args.seq_len
    per_rate = {r: [] for r in rates}
    cpu = {r: [] for r in rates}
    checks = {r: [] for r in rates}
    seconds = {r: [] for r in rates}
    train = {r: [] for r in rates}
    bookkeeping = {r: [] for r in rates}
    for k in range(args.repeats):
        for rate in rates:
            t0 = time.time()
            res = one_run(args, f"spot-overhead-{rate}", rate, args.steps, peers=args.peers,
                          pin=args.pin)
            tps = tokens_per_second(res, seq_len, args.skip)
            per_rate[rate].append(tps)
            cpu[rate].append(cpu_per_kilotoken(res, seq_len))
            resolved = [v for v in res["verify"] if v.get("check") in ("passed", "author_failed")]
            checks[rate].append(len(resolved))
            seconds[rate].extend(v["seconds"] for v in res["verdicts"] if v["seconds"] > 0)
            train[rate].extend(res["train_seconds"])
            bookkeeping[rate].extend(res["bookkeeping_seconds"])
            print(f"  repeat {k + 1}/{args.repeats} rate {rate}: {tps:,.0f} tokens/s, "
                  f"{cpu[rate][-1]:.3f} CPU s per 1k tokens, {len(resolved)} checks resolved "
                  f"({time.time() - t0:.0f} s)", flush=True)
    base = statistics.median(per_rate[rates[0]])
    cpu_base = statistics.median(cpu[rates[0]])
    table = []
    for rate in rates:
        med = statistics.median(per_rate[rate])
        table.append({"rate": rate, "tokens_per_second": per_rate[rate],
                      "median_tokens_per_second": med, "ratio": med / base if base else None,
                      "cpu_per_1k_tokens": cpu[rate],
                      "median_cpu_per_1k_tokens": statistics.median(cpu[rate]),
                      "cpu_ratio": statistics.median(cpu[rate]) / cpu_base if cpu_base else None,
                      "checks_resolved": checks[rate],
                      "checks_per_round": statistics.median(checks[rate]) / args.steps,
                      "median_check_seconds": statistics.median(seconds[rate]) if seconds[rate]
                      else None,
                      "median_train_seconds": statistics.median(train[rate]),
                      "median_bookkeeping_seconds": statistics.median(bookkeeping[rate])})
    print(f"\noverhead: {args.peers} peers{' (each pinned to a core)' if args.pin else ''}, "
          f"tiny model, {args.steps} steps, {args.repeats} repeats (medians)")
    print(f"{'verify.rate':>11}  {'tokens/s':>10}  {'vs rate 0':>9}  {'CPU s/1k tok':>12}  "
          f"{'vs rate 0':>9}  {'checks/round':>12}  "
          f"{'s/check':>8}  {'s/share':>8}  {'bookkeeping s':>13}")
    for row in table:
        s = row["median_check_seconds"]
        print(f"{row['rate']:>11}  {row['median_tokens_per_second']:>10,.0f}  "
              f"{row['ratio']:>9.3f}  {row['median_cpu_per_1k_tokens']:>12.4f}  "
              f"{row['cpu_ratio']:>9.3f}  {row['checks_per_round']:>12.2f}  "
              f"{'-' if s is None else f'{s:.3f}':>8}  {row['median_train_seconds']:>8.3f}  "
              f"{row['median_bookkeeping_seconds']:>13.4f}")
    return table


def run_detection(args, cheat):
    rate, cheater = 0.25, PEERS - 1
    res = one_run(args, f"spot-detection-{cheat}", rate, args.detection_steps, cheater=cheater,
                  extra=("--slowdown", "2"), sets=["verify.max_failures=1000", "verify.window=32"],
                  cheat=cheat)
    key = res["keys"][cheater]
    mine = [v for v in res["verify"] if v.get("author") == key]
    drawn_rounds = sorted({v["round"] for v in mine if v["check"] == "assigned"
                           and v.get("attempt") == 1})
    failed = sorted({v["round"] for v in mine if v["check"] == "author_failed"})
    unresolved = sorted({v["round"] for v in mine if v["check"] == "unresolved"})
    passed = sorted({v["round"] for v in mine if v["check"] == "passed"})
    still_open = len(drawn_rounds) - len(failed) - len(unresolved) - len(passed)
    trained = len([r for r in res["rows"]
                   if any(key.startswith(str(a)) for a in r.get("authors", []))])
    p_hat = len(drawn_rounds) / max(1, trained)
    d_hat = len(failed) / max(1, len(drawn_rounds))
    honest = [v for v in res["verdicts"] if v["author"] != key and v["outcome"] != "abstains"]
    false_pos = [v for v in res["verify"] if v["check"] == "author_failed" and v["author"] != key]
    wrongly_accused = [v for v in honest if v["outcome"] == "disagrees"]
    cheat_verdicts = [v for v in res["verdicts"] if v["author"] == key and
                      v["outcome"] != "abstains"]
    curve = []
    for r in (1, 2, 5, 10, 20):
        curve.append({"rounds": r, "expected": 1 - (1 - rate) ** r,
                      "measured": 1 - (1 - p_hat * d_hat) ** r})
    out = {"rate": rate, "cheat": cheat, "rounds_trained_by_cheater": trained,
           "checks_drawn": len(drawn_rounds), "checks_failed": len(failed),
           "checks_unresolved": len(unresolved), "checks_passed": len(passed),
           "checks_open_at_end": still_open, "first_failure_round": failed[0] if failed
           else None, "p_hat": p_hat, "detection_per_check": d_hat, "curve": curve,
           "honest_verdicts": len(honest), "honest_disagreements": len(wrongly_accused),
           "false_positives": len(false_pos),
           "honest_min_overlap": min((v["overlap"] for v in honest), default=None),
           "honest_min_worst_overlap": min((v["worst_overlap"] for v in honest), default=None),
           "honest_max_state_error": max((v["state_error"] for v in honest), default=None),
           "cheat_max_overlap": max((v["overlap"] for v in cheat_verdicts), default=None),
           "cheat_min_state_error": min((v["state_error"] for v in cheat_verdicts), default=None)}
    print(f"\ndetection: 1 of {PEERS} peers cheats ({cheat}), verify.rate {rate}, "
          f"{args.detection_steps} steps (--slowdown 2)")
    print(f"  its contributions drawn: {len(drawn_rounds)} of {trained} (p = {p_hat:.3f}, "
          f"design {rate}); confirmed failures: {len(failed)} (d = {d_hat:.3f}); "
          f"passed {len(passed)}, unresolved {len(unresolved)}, still open at the end "
          f"{still_open}; first failure at round {out['first_failure_round']}")
    print(f"  {'rounds R':>8}  {'1-(1-p)^R':>10}  {'measured':>9}")
    for c in curve:
        print(f"  {c['rounds']:>8}  {c['expected']:>10.3f}  {c['measured']:>9.3f}")
    print(f"  honest verdicts {len(honest)}: {len(wrongly_accused)} disagreed, "
          f"{len(false_pos)} honest authors failed; lowest overlap "
          f"{out['honest_min_overlap']}, highest momentum error {out['honest_max_state_error']}; "
          f"the cheat's highest overlap {out['cheat_max_overlap']}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agora", default="build/apps/agora/agora")
    ap.add_argument("--data", default="data/tokens/sp8k")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--detection-steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=256,
                    help="data.seq_len: tokens per sequence (the integration tests use 64)")
    ap.add_argument("--rates", type=lambda v: [float(x) for x in v.split(",")],
                    default=[0.0, 0.02, 0.05, 0.25],
                    help="verify.rate values for `overhead`, comma-separated; the first is the "
                         "baseline the others are compared with")
    ap.add_argument("--cheats", type=lambda v: v.split(","), default=["half_batch", "other_data"],
                    help="`detection`: AGORA_TEST_CHEAT values, one run each (half_batch trains "
                         "half its share, other_data other sequences)")
    ap.add_argument("--peers", type=int, default=PEERS, help="`overhead`: how many peers")
    ap.add_argument("--pin", action="store_true",
                    help="`overhead`: pin peer i to core i (taskset), as if each had a machine of "
                         "its own: its checks then take its own time, not its neighbours'")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. train.batch_size=96 for longer "
                         "rounds); repeatable")
    ap.add_argument("--skip", type=int, default=5,
                    help="`overhead`: finalized steps left out of tokens/s (joins, warm-up)")
    ap.add_argument("--scenario", default="all", choices=["all", "overhead", "detection"])
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    args = ap.parse_args()
    args.agora, args.data = os.path.abspath(args.agora), os.path.abspath(args.data)
    results = {}
    if args.scenario in ("all", "overhead"):
        results["overhead"] = run_overhead(args)
    if args.scenario in ("all", "detection"):
        results["detection"] = [run_detection(args, cheat) for cheat in args.cheats]
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
