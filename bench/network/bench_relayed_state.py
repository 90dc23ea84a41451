#!/usr/bin/env python3
"""A joiner's parameters from members it can dial, against from members nobody can dial.

    bench_relayed_state.py --agora build/apps/agora/agora [--data data/tokens/sp8k]
                           [--preset small] [--repeats 3] [--json FILE]

Real processes on loopback (tests/integration/network_run.Run, the integration tests' config
with the model preset replaced): a coordinator and 2 members train; once a few steps are final a
third peer joins and loads the parameters. "direct": the members advertise their own ports and
the joiner dials them (peer_fetch.cc). "relayed": both advertise a port nobody listens on, as
peers behind NAT do; the coordinator marks them relayed and the joiner gets every tensor chunk by
chunk through the coordinator (coord/tensor_relay.h), paced to its 32 MB/s. Reported per mode:
the joiner's load time (its state_loaded event), the model's bytes, MB/s, and the chunks
relayed. Loopback has no bandwidth limit: the figures are the protocol's own cost (chunking,
two hops, the pace), not a home link's.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from network_run import Run, free_port, parse_json_lines  # noqa: E402


def one(agora, data, preset, relayed):
    members = 2
    run = Run(agora, data, f"relayed-state-{preset}", peers=members + 1, steps=400,
              sets=[f'model.preset="{preset}"', "network.min_peers=2"])
    try:
        run.start_coordinator(extra=("--http", "off", "--log-format", "json"))
        for i in range(members):
            extra = ("--advertise", f"tcp://127.0.0.1:{free_port()}") if relayed else ()
            run.start_peer(i, extra=extra)
        if relayed:
            for i in range(members):
                run.wait_until(f"peer {i} marked unreachable",
                               lambda i=i: [r for r in run.log_rows("join", run.short(i))
                                            if r.get("reason") == "unreachable"], 120)
        run.wait_final(len(run.steps_final()) + 3, timeout=300)
        run.start_peer(members)
        run.wait_until("the joiner's parameters",
                       lambda: run.events(members, "state_loaded"), 600)
        loaded = run.events(members, "state_loaded")[0]
        if loaded["source"] != "members":
            run.fail(f"the joiner loaded from {loaded['source']}, not the members")
        chunks = bytes_in = 0
        if relayed:
            # The coordinator says what it relayed every 10 s (relay_tensors).
            def relayed_rows():
                return [j for j in parse_json_lines(os.path.join(run.dir, "coordinator.log"))
                        if j.get("event") == "relay_tensors"]
            # A line written after the load covers all of it (one may have cut it in two).
            loaded_at = loaded["ts"]
            run.wait_until("the coordinator's relay_tensors line after the load",
                           lambda: [j for j in relayed_rows() if j["ts"] > loaded_at], 30)
            chunks = sum(j["chunks"] for j in relayed_rows())
            bytes_in = sum(j["bytes_in"] for j in relayed_rows())
        return {"seconds": loaded["seconds"], "applied_steps": loaded["applied_steps"],
                "chunks": chunks, "bytes": bytes_in}
    finally:
        run.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--data", default="data/tokens/sp8k")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="out/bench_relayed_state.json")
    args = ap.parse_args()
    results = {"direct": [], "relayed": []}
    for r in range(args.repeats):
        for mode in ("direct", "relayed"):
            got = one(args.agora, args.data, args.preset, mode == "relayed")
            results[mode].append(got)
            print(f"[{r + 1}/{args.repeats}] {mode:8s} loaded the parameters after step "
                  f"{got['applied_steps']} in {got['seconds']:.2f} s, {got['chunks']} chunks "
                  f"relayed", flush=True)
    # The model's bytes: what the relay carried in for one joiner.
    size = statistics.median(r["bytes"] for r in results["relayed"]) or None
    print()
    print(f"model preset {args.preset}: "
          f"{'?' if size is None else f'{size / 1e6:.1f} MB'} of fp32 parameters, "
          f"medians of {args.repeats}")
    print("| joiner fetches from | load s (median) | MB/s | chunks through the relay |")
    print("|---|---:|---:|---:|")
    table = {}
    for mode, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        chunks = statistics.median(r["chunks"] or 0 for r in runs)
        rate = None if size is None else size / 1e6 / seconds
        table[mode] = {"seconds": seconds, "mb_per_second": rate, "chunks": chunks,
                       "runs": [r["seconds"] for r in runs]}
        print(f"| {mode} | {seconds:.2f} | {'?' if rate is None else f'{rate:.1f}'} | "
              f"{chunks:.0f} |")
    ratio = table["relayed"]["seconds"] / table["direct"]["seconds"]
    print(f"relayed / direct load time: {ratio:.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"preset": args.preset, "model_bytes": size, "repeats": args.repeats,
                   "modes": table, "relayed_over_direct": ratio}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
