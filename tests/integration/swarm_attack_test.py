#!/usr/bin/env python3
"""Hostile swarm replicas against real processes (issue 38, findings 2 and 3; schedule.h,
"Deadlines and strikes"; router.h).

    swarm_attack_test.py AGORA AGORA_PROBE DATA_DIR OUT

A coordinator and six replicas of a 2-stage model, as processes on loopback:
  stage 0: a0, a1 (honest), hold (asks for every micro-batch it may hold, never works on one)
  stage 1: b0 (honest), mute (never sends its round contribution),
           liar (answers every forward at once with garbage backwards claiming 1e-30 s of
           compute, and drops the forward)
Before the deadlines, the holder and the silent replica each held a step open for good, and the
liar became the honest sender's choice for every micro-batch, which it dropped, and was never
struck for it; and any stranger could read a replica's stage (finding 5). Checked, from the
structured output only:
  - the coordinator finishes every step, within a bound derived from the deadlines it was given;
  - the holder and the silent replica are struck and banned (swarm_struck, swarm_banned), the
    liar is struck for dropped micro-batches (both honest senders named it), and nobody else is
    ever struck;
  - the honest replicas finish at the last step, and the replicas of stage 1 that finished hold
    the same parameters;
  - the loss went down;
  - a stranger asking a0 for its embedding at every step gets nothing: a0 admits only the
    members of its own and the previous stage at the CURVE handshake (refused_handshakes).
"""
import json
import os
import shutil
import subprocess
import sys
import time

STEPS = 6
PACE = 0.01  # seconds per sample at speed 1
MIN_DEADLINE = 2
DEADLINE_FACTOR = 4
MAX_STRIKES = 2
PEER_TIMEOUT = 5  # the sender's timeout for an unanswered micro-batch, and the coordinator's


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


def main():
    agora, probe, data, out = sys.argv[1:5]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "configs", "swarm.toml")
    sets = ["--set", f"data.dir={data}", "--set", f"train.steps={STEPS}",
            "--set", "pipeline.stages=2"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    roles = {"a0": (0, ""), "a1": (0, ""), "hold": (0, "hold"), "b0": (1, ""),
             "mute": (1, "mute"), "liar": (1, "liar")}
    hostile = {"hold", "mute"}  # the ones the coordinator can see misbehave
    keys = {n: run([agora, "keygen", "--out", f"{out}/{n}.key"]).strip().split()[-1]
            for n in ["coordinator", *roles]}
    short = {n: k[:8] for n, k in keys.items()}
    coordinator = subprocess.Popen(
        [agora, "swarm", "serve", "--config", config, *sets, "--key", f"{out}/coordinator.key",
         "--listen", "tcp://127.0.0.1:*", "--open", "--peers", str(len(roles)),
         "--peer-timeout", str(PEER_TIMEOUT), "--min-deadline", str(MIN_DEADLINE),
         "--deadline-factor", str(DEADLINE_FACTOR), "--max-strikes", str(MAX_STRIKES),
         "--http", "off", "--out", f"{out}/coordinator"],
        stdout=open(f"{out}/coordinator.out", "w"), stderr=subprocess.STDOUT)
    log = f"{out}/coordinator/events.jsonl"
    peers = {}
    started = time.time()
    try:
        deadline = time.time() + 60
        serve = None
        while serve is None and time.time() < deadline:
            serve = next((e for e in events(log) if e["event"] == "swarm_serve"), None)
            if coordinator.poll() is not None:
                sys.exit("FAILED: the coordinator exited before it listened")
            time.sleep(0.05)
        assert serve, "the coordinator never listened"
        for name, (stage, behave) in roles.items():
            peers[name] = subprocess.Popen(
                [agora, "swarm", "peer", "--config", config, *sets, "--key", f"{out}/{name}.key",
                 "--coordinator", serve["listen"], "--coordinator-key", keys["coordinator"],
                 "--listen", "tcp://127.0.0.1:*", "--stage", str(stage),
                 "--pace-unit", str(PACE), "--timeout", str(PEER_TIMEOUT),
                 "--events", f"{out}/{name}.jsonl", *(["--behave", behave] if behave else [])],
                stdout=open(f"{out}/{name}.out", "w"), stderr=subprocess.STDOUT)
        # Each hostile replica can hold a step for at most a deadline per strike; the first
        # deadlines are min_deadline x factor (nothing measured yet). A clean run of these steps
        # takes a few seconds; 90 s of slack covers a loaded machine.
        bound = 2 * MAX_STRIKES * MIN_DEADLINE * DEADLINE_FACTOR + 2 * PEER_TIMEOUT + 90
        # A stranger guesses a0's version: it must read nothing.
        while not any(e["event"] == "swarm_step" for e in events(log)):
            if coordinator.poll() is not None:
                sys.exit("FAILED: the coordinator exited before the first step")
            if time.time() - started > bound:
                sys.exit(f"FAILED: no step within {bound} s: "
                         f"{[e for e in events(log) if e['event'] != 'swarm_status'][-8:]}")
            time.sleep(0.05)
        a0 = next(e for e in events(f"{out}/a0.jsonl") if e["event"] == "start")
        stranger = json.loads(run([probe, "--endpoint", a0["endpoint"], "--server-key", keys["a0"],
                                   "--get-tensor", "model.embed_tokens.weight",
                                   "--up-to-step", str(STEPS), "--seconds", "2"]))["get_tensor"]
        assert stranger["tensor_data"] == 0, stranger  # refused at the handshake (below)
        try:
            assert coordinator.wait(timeout=max(1, bound - (time.time() - started))) == 0, \
                "the coordinator failed"
        except subprocess.TimeoutExpired:
            sys.exit(f"FAILED: the run did not finish within {bound} s: "
                     f"{[e for e in events(log) if e['event'] != 'swarm_status'][-8:]}")
        for name in ("a0", "a1", "b0"):
            assert peers[name].wait(timeout=60) == 0, f"{name} failed: see {out}/{name}.out"
        for name in (*hostile, "liar"):  # refused for good once banned: they exit with the reason
            try:
                peers[name].wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in [coordinator, *peers.values()]:
            if p.poll() is None:
                p.kill()
    elapsed = time.time() - started

    log_events = events(log)
    summary = next(e for e in log_events if e["event"] == "swarm_summary")
    assert summary["steps"] == STEPS, summary
    assert summary["last_loss"] < summary["first_loss"], summary
    struck = [e for e in log_events if e["event"] == "swarm_struck"]
    banned = {e["peer"] for e in log_events if e["event"] == "swarm_banned"}
    honest = {short[n] for n in roles if n not in hostile and n != "liar"}
    assert not [e for e in struck if e["peer"] in honest], ("an honest replica was struck", struck)
    assert {short[n] for n in hostile} <= banned, (banned, struck)
    holder = [e for e in struck if e["peer"] == short["hold"]]
    assert holder and all("micro-batches past" in e["why"] for e in holder), holder
    silent = [e for e in struck if e["peer"] == short["mute"]]
    assert silent and all("no contribution" in e["why"] for e in silent), silent
    liar = [e for e in struck if e["peer"] == short["liar"]]
    assert liar and all("dropped micro-batches" in e["why"] for e in liar), liar

    finished = ["a0", "a1", "b0"] + ([] if short["liar"] in banned else ["liar"])
    finish = {n: [e for e in events(f"{out}/{n}.jsonl") if e["event"] == "finish"][-1]
              for n in finished}
    for name, f in finish.items():
        assert f["finished"] and f["ready"] and f["version"] == STEPS, (name, f)
    assert finish["a0"]["parameter_hash"] == finish["a1"]["parameter_hash"], finish
    assert finish["a0"]["refused_handshakes"] >= 1, finish["a0"]  # the stranger
    if "liar" in finish:
        assert finish["b0"]["parameter_hash"] == finish["liar"]["parameter_hash"], finish
    print(f"ok: {STEPS} steps in {elapsed:.1f} s (bound {bound} s), struck "
          f"{sorted({e['peer'] for e in struck})}, banned {sorted(banned)}, loss "
          f"{summary['first_loss']:.3f} -> {summary['last_loss']:.3f}")


if __name__ == "__main__":
    main()
