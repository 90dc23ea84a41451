#!/usr/bin/env python3
"""bench/coord: one real coordinator under N members (issue 41, docs/scaling.md).

    bench_coordinator_load.py --agora build/apps/agora/agora
                              --light build/bench/coord/agora_light_members
                              [--members 10,100,300,1000] [--rounds 10] [--real-peers 1]
                              [--per-process 125] [--fetch 1] [--speed 8]
                              [--data data/tokens/sp8k] [--out out/coord-load]

Per N: the real `agora coordinator` (SQLite, CURVE, its own process), N light members
(agora_light_members, --per-process to a process; bench/coord/light_members.cc says what they do
and do not do) and --real-peers real `agora peer` processes training the tiny model, all on
loopback. The run is train.steps = --rounds steps of a global batch of 4 sequences per member, shared
by throughput (light members claim and keep --speed sequences/s, so every member has a share);
the first round opens when every member joined (network.min_peers = N + real peers). The run
finishes by itself; anything still up after --timeout seconds is killed, and every process is
cleaned up either way.

Measured per N, printed as a table and written to OUT/bench_coordinator_load.json:
- join: seconds from the coordinator's start to the first round (every member joined);
- round: per step, seconds from the first member's RoundStart to the last member's Finalized
  (median and max over the steps after the first);
- misses: strikes the coordinator gave (a missed commit or witness deadline) and steps that
  finalized at their witness deadline rather than on the last witness;
- coordinator CPU share (user + system over the rounds' wall time, 1.0 = one core), its CPU
  seconds per round, and peak RSS (VmHWM);
- SQLite: bytes the coordinator process wrote to storage per round (/proc/PID/io write_bytes,
  its only writer) and the database's size at the end;
- messages: to and from the coordinator per round, from the light members' counts scaled to
  every member (join, welcome and admit are the join phase, reported apart);
- download: what a real peer received per round (its summary's bytes_received over the rounds),
  against N x the payload size.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOIN_KINDS = {"join", "welcome", "admit", "refused"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(count, start):
    """`count` consecutive ports from `start` on that nothing listens on now."""
    port = start
    while True:
        ok = True
        for p in range(port, port + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    port = p + 1
                    break
        if ok:
            return port


def proc_sample(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        hwm = rss = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        written = 0
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    written = int(line.split()[1])
        return {"t": time.time(), "cpu": cpu, "hwm": hwm, "rss": rss, "written": written}
    except (OSError, ValueError, IndexError):
        return None


def jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def config_text(args, n, real):
    members = n + real
    return f"""seed = 7
[model]
preset = "tiny"
vocab_size = 8192
[data]
dir = "{os.path.abspath(args.data)}"
seq_len = 64
[train]
steps = {args.rounds}
batch_size = {4 * members}
micro_batch_size = 2
checkpoint_interval = 0
device = "cpu"
threads = 1
[optimizer]
name = "demo"
lr = 1e-3
weight_decay = 0.0
[demo]
topk = 8
one_bit = true
[schedule]
kind = "constant"
warmup_steps = 0
[network]
min_peers = {members}
max_members = {min(2048, members + 16)}
warmup_seconds = 2.0
overlap = 1
deadline_factor = 3.0
min_deadline_seconds = {args.deadline}
witness_seconds = {args.deadline}
heartbeat_timeout_seconds = 60.0
max_strikes = 3
hash_interval = 5
quorum = 0.5
checkpointers = 0
finish_grace_seconds = 5.0
[verify]
rate = 0.0
"""


def run_one(args, n):
    work = tempfile.mkdtemp(prefix=f"agora-coord-load-{n}-")
    procs = []
    real = args.real_peers

    def spawn(cmd, name):
        p = subprocess.Popen(cmd, stdout=open(os.path.join(work, name + ".out"), "w"),
                             stderr=open(os.path.join(work, name + ".log"), "w"),
                             start_new_session=True)
        procs.append(p)
        return p

    try:
        key_out = subprocess.run([args.agora, "keygen", "--out", os.path.join(work, "coord.key")],
                                 check=True, capture_output=True, text=True)
        coord_key = key_out.stdout.strip()
        port = free_port()
        config = os.path.join(work, "run.toml")
        with open(config, "w") as f:
            f.write(config_text(args, n, real))
        db = os.path.join(work, "coordinator.db")
        started = time.time()
        coordinator = spawn([args.agora, "coordinator", "--config", config, "--key",
                             os.path.join(work, "coord.key"), "--http", "off", "--json",
                             "--set", f'network.listen="tcp://127.0.0.1:{port}"',
                             "--set", f'network.state_db="{db}"', "--set", "network.open=true"],
                            "coordinator")
        endpoint = f"tcp://127.0.0.1:{port}"
        time.sleep(0.5)
        base = 20000
        reports = []
        index = 0
        while index < n:
            count = min(args.per_process, n - index)
            first_port = free_range(count, base)
            base = first_port + count
            out = os.path.join(work, f"light{index}.json")
            reports.append(out)
            spawn([args.light, "--coordinator", endpoint, "--coordinator-key", coord_key,
                   "--members", str(count), "--first-index", str(index), "--first-port",
                   str(first_port), "--fetch", str(args.fetch), "--sequences-per-second",
                   str(args.speed), "--seconds", str(args.timeout),
                   "--seed", f"load-{n}", "--out", out], f"light{index}")
            index += count
        for i in range(real):
            name = f"peer{i}"
            subprocess.run([args.agora, "keygen", "--out", os.path.join(work, name + ".key")],
                           check=True, capture_output=True)
            own = free_range(1, base)
            base = own + 1
            spawn([args.agora, "peer", "--coordinator", endpoint, "--coordinator-key", coord_key,
                   "--key", os.path.join(work, name + ".key"), "--data", args.data,
                   "--listen", f"tcp://127.0.0.1:{own}", "--threads", "1",
                   "--log-format", "json"], name)
        samples = []
        deadline = started + args.timeout
        while time.time() < deadline and coordinator.poll() is None:
            s = proc_sample(coordinator.pid)
            if s:
                samples.append(s)
            time.sleep(0.25)
        timed_out = coordinator.poll() is None
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return summarise(args, n, work, samples, reports, started, timed_out, db)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def summarise(args, n, work, samples, reports, started, timed_out, db):
    events = jsonl(os.path.join(work, "coordinator.out"))
    light = [json.load(open(r)) for r in reports if os.path.exists(r)]
    steps = {}
    for rep in light:
        for step, t in rep["steps"].items():
            s = steps.setdefault(int(step), {"round_first": None, "final_last": None,
                                             "finals": 0})
            if t["rounds"]:
                s["round_first"] = (t["round_first"] if s["round_first"] is None
                                    else min(s["round_first"], t["round_first"]))
            if t["finals"]:
                s["final_last"] = (t["final_last"] if s["final_last"] is None
                                   else max(s["final_last"], t["final_last"]))
                s["finals"] += t["finals"]
    latencies = [s["final_last"] - s["round_first"] for k, s in sorted(steps.items())
                 if k > 0 and s["round_first"] and s["final_last"]]
    # Where a round's time goes (medians over steps after the first): the spread of each
    # broadcast's arrival over the members, and the phases between them.
    marks = {}
    for rep in light:
        for step, t in rep["steps"].items():
            if int(step) == 0:
                continue
            m = marks.setdefault(int(step), {})
            for key in ("round", "collect", "final"):
                first, last = t.get(key + "_first") or 0, t.get(key + "_last") or 0
                if first > 0:
                    m[key + "_first"] = min(m.get(key + "_first", first), first)
                    m[key + "_last"] = max(m.get(key + "_last", last), last)
    phase_spans = {"round_start_spread": ("round_first", "round_last"),
                   "to_first_collect": ("round_first", "collect_first"),
                   "collect_spread": ("collect_first", "collect_last"),
                   "to_first_finalized": ("collect_last", "final_first"),
                   "finalized_spread": ("final_first", "final_last")}
    phases = {}
    for name, (a, b) in phase_spans.items():
        spans = [m[b] - m[a] for m in marks.values() if a in m and b in m]
        phases[name] = statistics.median(spans) if spans else None
    finalized = sum(1 for e in events if e.get("event") == "step")
    strikes = sum(1 for e in events if e.get("kind") == "strike" or e.get("event") == "strike")
    first_round = min((s["round_first"] for s in steps.values() if s["round_first"]), default=None)
    last_final = max((s["final_last"] for s in steps.values() if s["final_last"]), default=None)
    window = [s for s in samples if first_round and last_final and
              first_round <= s["t"] <= last_final]
    cpu_share = None
    cpu_per_round = None
    written_per_round = None
    if len(window) >= 2 and finalized > 1:
        cpu_share = (window[-1]["cpu"] - window[0]["cpu"]) / (window[-1]["t"] - window[0]["t"])
        cpu_per_round = (window[-1]["cpu"] - window[0]["cpu"]) / max(1, finalized - 1)
        written_per_round = (window[-1]["written"] - window[0]["written"]) / max(1, finalized - 1)
    peak_rss = max((s["hwm"] for s in samples), default=0)
    members = [m for rep in light for m in rep["members"]]
    welcomed = sum(1 for m in members if m["welcomed"] or m["commits"] > 0)
    to_c = {}
    from_c = {}
    for rep in light:
        for k, v in rep["to_coordinator"].items():
            to_c.setdefault(k, [0, 0])
            to_c[k][0] += v["count"]
            to_c[k][1] += v["bytes"]
        for k, v in rep["from_coordinator"].items():
            from_c.setdefault(k, [0, 0])
            from_c[k][0] += v["count"]
            from_c[k][1] += v["bytes"]
    scale = (n + args.real_peers) / max(1, len(members))
    rounds = max(1, finalized)
    msgs_round = sum(v[0] for k, v in {**{"to_" + k: v for k, v in to_c.items()},
                                        **{"from_" + k: v for k, v in from_c.items()}}.items()
                     if k.split("_", 1)[1] not in JOIN_KINDS) * scale / rounds
    bytes_out_round = sum(v[1] for k, v in from_c.items() if k not in JOIN_KINDS) * scale / rounds
    join_msgs = sum(v[0] for k, v in list(to_c.items()) + list(from_c.items()) if k in JOIN_KINDS)
    payload = max((rep.get("payload_bytes", 0) for rep in light), default=0)
    peer_rx = []
    peer_rejected = 0
    peer_summaries = 0
    for i in range(args.real_peers):
        for e in jsonl(os.path.join(work, f"peer{i}.log")):
            if e.get("event") == "summary":
                peer_rx.append(e.get("bytes_received", 0) / rounds)
                peer_rejected += e.get("payloads_rejected", 0)
                peer_summaries += 1
    return {
        "members": n,
        "real_peers": args.real_peers,
        "finalized": finalized,
        "rounds": args.rounds,
        "timed_out": timed_out,
        "welcomed": welcomed,
        "join_seconds": (first_round - started) if first_round else None,
        "round_seconds_median": statistics.median(latencies) if latencies else None,
        "round_seconds_max": max(latencies) if latencies else None,
        "round_seconds": latencies,
        "round_phases_median_seconds": phases,
        "light_sequences_per_second": args.speed,
        "strikes": strikes,
        "coordinator_cpu_share": cpu_share,
        "coordinator_cpu_seconds_per_round": cpu_per_round,
        "coordinator_peak_rss_bytes": peak_rss,
        "sqlite_bytes_written_per_round": written_per_round,
        "sqlite_file_bytes": sum(os.path.getsize(p) for p in (db, db + "-wal")
                                 if os.path.exists(p)),
        "messages_per_round": msgs_round,
        "coordinator_bytes_sent_per_round": bytes_out_round,
        "join_messages": join_msgs * scale,
        "to_coordinator": to_c,
        "from_coordinator": from_c,
        "payload_bytes": payload,
        "real_peer_bytes_received_per_round": statistics.median(peer_rx) if peer_rx else None,
        "real_peer_payloads_rejected": peer_rejected,
        "real_peer_summaries": peer_summaries,
        "all_payloads_per_round": payload * (n + args.real_peers - 1),
    }


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agora", default=os.path.join(ROOT, "build/apps/agora/agora"))
    ap.add_argument("--light", default=os.path.join(ROOT, "build/bench/coord/agora_light_members"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data/tokens/sp8k"))
    ap.add_argument("--members", default="10,100,300,1000")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--real-peers", type=int, default=1)
    ap.add_argument("--per-process", type=int, default=125)
    ap.add_argument("--fetch", type=int, default=1)
    ap.add_argument("--speed", type=float, default=8.0,
                    help="sequences per second a light member claims and 'trains' at")
    ap.add_argument("--deadline", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--require-complete", action="store_true",
                    help="exit 1 unless every run finalized every step without a strike and "
                         "every real peer ended applying every light member's payload (the "
                         "smoke test in make test)")
    ap.add_argument("--out", default=os.path.join(ROOT, "out/coord-load"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for n in [int(x) for x in args.members.split(",")]:
        print(f"N = {n}: starting", file=sys.stderr, flush=True)
        r = run_one(args, n)
        results.append(r)
        print(f"N = {n}: {r['finalized']} of {r['rounds']} steps, round median "
              f"{fmt(r['round_seconds_median'], '.2f')} s", file=sys.stderr, flush=True)
        with open(os.path.join(args.out, "bench_coordinator_load.json"), "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=1)
    print(f"| N | steps | join s | round s (median / max) | strikes | coord CPU | peak RSS MB | "
          f"SQLite KB/round | msgs/round | coord MB sent/round | real peer MB/round | "
          f"N x payload MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['members']} | {r['finalized']}/{r['rounds']} | {fmt(r['join_seconds'], '.1f')} | "
              f"{fmt(r['round_seconds_median'], '.2f')} / {fmt(r['round_seconds_max'], '.2f')} | "
              f"{r['strikes']} | {fmt(r['coordinator_cpu_share'], '.2f')} | "
              f"{r['coordinator_peak_rss_bytes'] / 1e6:.0f} | "
              f"{fmt(r['sqlite_bytes_written_per_round'] and r['sqlite_bytes_written_per_round'] / 1e3, '.0f')} | "
              f"{r['messages_per_round']:.0f} | {r['coordinator_bytes_sent_per_round'] / 1e6:.2f} | "
              f"{fmt(r['real_peer_bytes_received_per_round'] and r['real_peer_bytes_received_per_round'] / 1e6, '.2f')} | "
              f"{r['all_payloads_per_round'] / 1e6:.2f} |")


    if args.require_complete:
        bad = [r for r in results
               if r["finalized"] != r["rounds"] or r["strikes"] != 0 or r["welcomed"] != r["members"]
               or r["real_peer_payloads_rejected"] != 0
               or r["real_peer_summaries"] != r["real_peers"]]
        for r in bad:
            print(f"N = {r['members']}: {r['finalized']} of {r['rounds']} steps, {r['strikes']} "
                  f"strikes, {r['welcomed']} of {r['members']} welcomed, real peers: "
                  f"{r['real_peer_summaries']} of {r['real_peers']} summaries, "
                  f"{r['real_peer_payloads_rejected']} payloads rejected", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
