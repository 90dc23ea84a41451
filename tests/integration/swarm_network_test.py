#!/usr/bin/env python3
"""The swarm across processes (docs/swarm.md section 4): a coordinator and six replicas, two per
stage of a 3-stage model, as real processes on loopback; replicas die and come back.

    swarm_network_test.py AGORA DATA_DIR OUT

`agora swarm serve` and six `agora swarm peer` processes (--state-dir on each). Timeline, driven
by the coordinator's events:
  - after step 3: one replica of stage 1 is SIGKILLed, and started again (without its saved
    state) once the coordinator has lost it: it must fetch stage 1 from the other replica,
    hash-checked;
  - after step 8: both replicas of stage 2 are SIGKILLed. The run must wait (phase "waiting",
    stage 2 "no replica" in /api/swarm) rather than fail; one is started again and brings stage 2
    back from the copy it saved (restored), the other (without its copy) fetches it from that
    one;
  - after step 12: a stage-0 replica is stopped (SIGSTOP) until the coordinator loses it, then
    continued: it must join again by itself.
Checked, from the structured output only:
  - the coordinator finishes every step; it lost the three replicas and logged the wait;
  - every replica finishes at the last step, and the replicas of each stage end bit-identical
    (the same parameter hash in their finish events);
  - /api/swarm and /metrics showed the wait: phase waiting, stage 2 with no replica serving;
  - the stage-1 replica fetched, the stage-2 replicas restored and fetched, at the hash the
    stage's other replicas reported for that step;
  - the loss went down; the stage files merge into one checkpoint that agora eval reads;
  - p0 has no copy of the data (its data.dir does not exist): it fetched the run's from the
    coordinator, and its folder ends holding exactly the run's tokens.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

STEPS = 20
FETCHER = "p0"  # the replica without a copy of the data
PACE = 0.02  # seconds per sample at speed 1: a step of 32 samples takes about a second


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def status(url):
    try:
        with urllib.request.urlopen(url + "/api/swarm", timeout=2) as r:
            return json.loads(r.read().decode())
    except (OSError, ValueError):
        return None


def main():
    agora, data, out = sys.argv[1:4]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "configs", "swarm.toml")
    data_hash = run([agora, "data", "hash", data]).strip()
    sets = ["--set", f"data.dir={data}", "--set", f"train.steps={STEPS}",
            "--set", f"data.hash={data_hash}"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    names = [f"p{i}" for i in range(6)]
    stage_of = {name: i // 2 for i, name in enumerate(names)}
    keys = {n: run([agora, "keygen", "--out", f"{out}/{n}.key"]).strip().split()[-1]
            for n in ["coordinator", *names]}
    coordinator = subprocess.Popen(
        [agora, "swarm", "serve", "--config", config, *sets, "--key", f"{out}/coordinator.key",
         "--listen", "tcp://127.0.0.1:*", "--open", "--peers", "6", "--peer-timeout", "2",
         "--http", "127.0.0.1:0", "--out", f"{out}/coordinator"],
        stdout=open(f"{out}/coordinator.out", "w"), stderr=subprocess.STDOUT)
    log = f"{out}/coordinator/events.jsonl"
    peers = {}

    def start(name):
        # p0 has no copy of the data: it fetches the run's from the coordinator.
        fetch = ["--set", "data.dir=/nonexistent/agora-data",
                 "--data-cache", f"{out}/{name}-data"] if name == FETCHER else []
        peers[name] = subprocess.Popen(
            [agora, "swarm", "peer", "--config", config, *sets, *fetch,
             "--key", f"{out}/{name}.key",
             "--coordinator", serve["listen"], "--coordinator-key", keys["coordinator"],
             "--listen", "tcp://127.0.0.1:*", "--stage", str(stage_of[name]),
             "--pace-unit", str(PACE), "--timeout", "10", "--events", f"{out}/{name}.jsonl",
             "--out", f"{out}/stage-{name}", "--state-dir", f"{out}/state-{name}"],
            stdout=open(f"{out}/{name}.out", "a"), stderr=subprocess.STDOUT)

    def wait_for(what, predicate, seconds=120):
        deadline = time.time() + seconds
        while time.time() < deadline:
            found = predicate()
            if found:
                return found
            if coordinator.poll() is not None:
                sys.exit(f"FAILED: the coordinator exited while waiting for {what}")
            time.sleep(0.05)
        sys.exit(f"FAILED: timed out waiting for {what}")

    def stepped(n):
        return lambda: any(e["event"] == "swarm_step" and e["step"] >= n for e in events(log))

    def lost(name):
        short = keys[name][:8]
        return lambda: any(e["event"] == "swarm_lost" and e["peer"] == short for e in events(log))

    try:
        serve = wait_for("the coordinator's address", lambda: next(
            (e for e in events(log) if e["event"] == "swarm_serve"), None), 60)
        http = wait_for("the live page", lambda: next(
            (e["url"] for e in events(log) if e["event"] == "swarm_http"), None), 60)
        assert serve["key"] == keys["coordinator"], serve
        for name in names:
            start(name)

        wait_for("step 3", stepped(3))
        peers["p2"].send_signal(signal.SIGKILL)
        peers["p2"].wait()
        wait_for("p2 lost", lost("p2"))
        shutil.rmtree(f"{out}/state-p2")  # back on a machine that lost its disk: it must fetch
        start("p2")

        wait_for("step 8", stepped(8))
        for name in ("p4", "p5"):
            peers[name].send_signal(signal.SIGKILL)
            peers[name].wait()
        wait_for("p4 and p5 lost", lambda: lost("p4")() and lost("p5")())
        waiting = wait_for("the page to show stage 2 without a replica", lambda: (
            lambda s: s if s and s["phase"] == "waiting" and
            s["stages"][2]["state"] == "no replica" else None)(status(http)))
        assert "stage 2" in waiting["waiting_for"], waiting
        with urllib.request.urlopen(http + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'agora_swarm_phase{phase="waiting"} 1' in metrics, metrics
        assert 'agora_swarm_replicas{stage="2",state="serving"} 0' in metrics, metrics
        assert 'agora_swarm_stage_throughput{stage="2"} 0' in metrics, metrics
        with urllib.request.urlopen(http + "/", timeout=5) as r:
            page = r.read().decode()
        assert "<title>agora swarm</title>" in page and "/api/swarm" in page, page[:200]
        start("p4")
        wait_for("p4 to bring stage 2 back",
                 lambda: any(e["event"] == "restored" for e in events(f"{out}/p4.jsonl")))
        shutil.rmtree(f"{out}/state-p5")
        start("p5")

        # A stall longer than the coordinator's patience (a suspended laptop, a partition):
        # stage-0 replica p1 is lost, then comes back and joins again by itself.
        wait_for("step 12", stepped(12))
        peers["p1"].send_signal(signal.SIGSTOP)
        wait_for("p1 lost", lost("p1"))
        peers["p1"].send_signal(signal.SIGCONT)

        assert coordinator.wait(timeout=300) == 0, "the coordinator failed"
        for name, p in peers.items():
            assert p.wait(timeout=60) == 0, f"{name} failed: see {out}/{name}.out"
    finally:
        for p in [coordinator, *peers.values()]:
            if p.poll() is None:
                p.kill()

    log_events = events(log)
    summary = next(e for e in log_events if e["event"] == "swarm_summary")
    assert summary["steps"] == STEPS and summary["samples"] == STEPS * 32, summary
    assert summary["lost"] >= 4 and summary["waiting_seconds"] > 0, summary
    assert any(e["event"] == "swarm_waiting" and e["stage"] == 2 for e in log_events), log_events
    assert summary["last_loss"] < summary["first_loss"], summary

    # Every replica's last word, and the replicas of a stage bit-identical.
    finish = {n: [e for e in events(f"{out}/{n}.jsonl") if e["event"] == "finish"][-1]
              for n in names}
    for name, f in finish.items():
        assert f["finished"] and f["ready"] and f["version"] == STEPS, (name, f)
        assert f["stage"] == stage_of[name], (name, f)
    for s in range(3):
        hashes = {finish[n]["parameter_hash"] for n in names if stage_of[n] == s}
        assert len(hashes) == 1, (s, hashes)
    assert len({f["parameter_hash"] for f in finish.values()}) == 3, finish

    # The joiners took the stage at the hash its other replicas held at that step.
    def step_hash(name, version):
        return next(e["hash"] for e in events(f"{out}/{name}.jsonl")
                    if e["event"] == "step" and e["version"] == version)

    p2 = [e for e in events(f"{out}/p2.jsonl") if e["event"] == "fetched"]
    assert len(p2) == 1 and p2[0]["hash"] == step_hash("p3", p2[0]["version"]), p2
    restored = [e for e in events(f"{out}/p4.jsonl") if e["event"] == "restored"]
    assert len(restored) == 1 and restored[0]["hash"] == step_hash("p5", restored[0]["version"])
    p5 = [e for e in events(f"{out}/p5.jsonl") if e["event"] == "fetched"]
    assert len(p5) == 1 and p5[0]["version"] >= restored[0]["version"], p5
    assert any(e["event"] == "rejoin" for e in events(f"{out}/p1.jsonl")), "p1 never rejoined"
    # The replica without a copy fetched the run's data, checked chunk by chunk: its folder holds
    # exactly the run's tokens (the prefetch fills it within the first second on loopback).
    held = run([agora, "data", "hash", f"{out}/{FETCHER}-data"]).strip()
    assert held == data_hash, f"{FETCHER}'s fetched folder hashes to {held}, the data to {data_hash}"

    # Each stage's replicas hold the same parameters, so merging either replica of every stage
    # gives the same model, bit for bit; and that model is the trained one: its validation loss
    # lies nearer the swarm's last training loss than its first (an untrained, half-merged or
    # misordered model would not).
    val_loss = {}
    for replicas in (("p0", "p2", "p4"), ("p1", "p3", "p5")):
        merged = f"{out}/merged-{'-'.join(replicas)}"
        os.makedirs(merged)
        for name in replicas:
            for f in os.listdir(f"{out}/stage-{name}"):
                shutil.copy(f"{out}/stage-{name}/{f}", merged)
        run([agora, "merge-stages", "--config", config, *sets, "--stages", merged,
             "--out", f"{merged}/checkpoint"])
        val_loss[replicas] = json.loads(run(
            [agora, "eval", "--checkpoint", f"{merged}/checkpoint", "--data",
             f"{data}/val_000000.bin", "--max-windows", "4", "--json"]))["val_loss"]
    assert len(set(val_loss.values())) == 1, f"the replicas merge to different models: {val_loss}"
    val = next(iter(val_loss.values()))
    first, last = summary["first_loss"], summary["last_loss"]
    assert last < first and abs(val - last) < abs(val - first), \
        f"the merged model's validation loss {val:.3f} is not the trained model's " \
        f"(training loss {first:.3f} -> {last:.3f})"
    print(f"ok: {STEPS} steps, {summary['samples_per_second']:.1f} samples/s "
          f"({100 * summary['efficiency']:.0f}% of ideal), lost {summary['lost']}, waited "
          f"{summary['waiting_seconds']:.1f} s, loss {summary['first_loss']:.3f} -> "
          f"{summary['last_loss']:.3f}, replicas of each stage identical, merged val loss "
          f"{val:.3f}")


if __name__ == "__main__":
    main()
