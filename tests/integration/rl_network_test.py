#!/usr/bin/env python3
"""RL over the network (docs/rl.md section 6): a learner and two rollout workers as real
processes, one of them cheating.

    rl_network_test.py AGORA OUT [CHEAT]

A small base model is made (corpus, tokenizer, a few training steps), then `agora rl serve` and
two `agora rl work` processes run on loopback: one honest, one with --behave CHEAT (default
fabricate: the right answers with invented log-probabilities). Checked, from the structured
output only:
  - the learner makes every update (rl_step rows 0..steps) and exits 0;
  - the cheater is banned (strikes >= the learner's --strikes), none of its rollouts is
    accepted, and its process stops with an rl_worker_banned event;
  - the honest worker is never struck or refused, every rollout it submitted was accepted, and
    every policy update it took matched the learner's state hash;
  - the status API, the page and /metrics show the run (step, verdicts, the banned worker).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

STEPS, PROMPTS, GROUP, STRIKES = 3, 4, 4, 3


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def make_base(agora, out, max_digits=3, steps=20):
    """A small base model trained `steps` steps on problems of operands of up to `max_digits`."""
    base = os.path.join(out, "base")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run([agora, "rl", "corpus", "--problems", "2000", "--max-digits", str(max_digits),
         "--out", f"{base}/problems.txt"])
    run([agora, "tokenizer", "train", "--input", f"{base}/problems.txt", "--vocab-size", "320",
         "--out", f"{base}/tokenizer.model"])
    run([agora, "tokenize", "--lines", "--tokenizer", f"{base}/tokenizer.model", "--input",
         f"{base}/problems.txt", "--out", f"{base}/tokens", "--val-fraction", "0.05", "--force"])
    run([agora, "train", "--config", os.path.join(root, "configs", "rl-base.toml"), "--quiet",
         "--set", f"data.dir={base}/tokens", "--set", f"train.out_dir={base}/run",
         "--set", f"train.steps={steps}",
         "--set", f"schedule.warmup_steps={min(10, steps // 10)}",
         "--set", "train.eval_interval=0"])
    return f"{base}/run/latest"


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def main():
    agora, out = sys.argv[1], sys.argv[2]
    cheat = sys.argv[3] if len(sys.argv) > 3 else "fabricate"
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    base = make_base(agora, out)
    keys = {}
    for name in ("learner", "honest", "cheat"):
        keys[name] = run([agora, "keygen", "--out", f"{out}/{name}.key"]).strip().split()[-1]
    learner_log = f"{out}/learner/rl.jsonl"
    learner = subprocess.Popen(
        [agora, "rl", "serve", "--checkpoint", base, "--key", f"{out}/learner.key",
         "--listen", "tcp://127.0.0.1:*", "--open", "--http", "127.0.0.1:0",
         "--run-id", "rl-network-test",
         "--steps", str(STEPS), "--prompts", str(PROMPTS), "--group", str(GROUP),
         "--eval-problems", "8", "--eval-interval", "0", "--strikes", str(STRIKES),
         "--reassign-after", "300", "--out", f"{out}/learner"],
        stdout=open(f"{out}/learner.out", "w"), stderr=subprocess.STDOUT)
    workers = {}
    try:
        started = None
        for _ in range(600):
            started = next((e for e in events(learner_log) if e["event"] == "rl_learner"), None)
            if started or learner.poll() is not None:
                break
            time.sleep(0.1)
        assert started, "the learner never logged its address"
        assert started["key"] == keys["learner"], (started["key"], keys["learner"])
        # The cheat first, alone until it is banned: started together, the honest worker could
        # fill every slot before the cheat asked for one (it did once, on a loaded machine), and
        # the test would check nothing about cheating.
        for name, behave in (("cheat", cheat), ("honest", "honest")):
            workers[name] = subprocess.Popen(
                [agora, "rl", "work", "--key", f"{out}/{name}.key", "--learner", started["listen"],
                 "--learner-key", keys["learner"], "--base", base, "--behave", behave,
                 "--slots", "8", "--log", f"{out}/{name}.jsonl", "--idle-timeout", "120"],
                stdout=open(f"{out}/{name}.out", "w"), stderr=subprocess.STDOUT)
            if name != "cheat":
                continue
            deadline = time.time() + 300
            while time.time() < deadline and workers[name].poll() is None and not any(
                    e["event"] == "rl_worker_banned" for e in events(f"{out}/{name}.jsonl")):
                time.sleep(0.1)
        # The status API while the learner lingers after its last update.
        status = None
        deadline = time.time() + 600
        while time.time() < deadline and learner.poll() is None:
            try:
                status = json.loads(get(started["http"] + "/api/rl"))
            except OSError:
                pass
            if status and status["finished"]:
                break
            time.sleep(0.2)
        assert status and status["finished"], f"the learner did not finish: {status}"
        metrics = get(started["http"] + "/metrics")
        page = get(started["http"] + "/")
        assert learner.wait(timeout=120) == 0, "the learner failed"
        for name, p in workers.items():
            p.wait(timeout=120)
    finally:
        for p in [learner, *workers.values()]:
            if p.poll() is None:
                p.kill()

    rows = [e for e in events(learner_log) if e["event"] == "rl_step"]
    assert [r["step"] for r in rows] == list(range(STEPS + 1)), [r["step"] for r in rows]
    intake = next(e for e in events(learner_log) if e["event"] == "rl_intake")
    strikes = intake["strikes"]
    assert strikes[keys["cheat"]] >= STRIKES, strikes
    assert strikes[keys["honest"]] == 0, strikes

    by_worker = {w["worker"]: w for w in status["workers"]}
    assert by_worker[keys["cheat"]]["banned"] and by_worker[keys["cheat"]]["accepted"] == 0, \
        by_worker[keys["cheat"]]
    honest = by_worker[keys["honest"]]
    assert honest["refused"] == 0 and not honest["banned"], honest
    # Every slot of every update was filled by the honest worker.
    assert honest["accepted"] == STEPS * PROMPTS * GROUP, honest

    cheat_events = events(f"{out}/cheat.jsonl")
    assert any(e["event"] == "rl_worker_banned" for e in cheat_events), cheat_events[-3:]
    honest_events = events(f"{out}/honest.jsonl")
    policies = [e for e in honest_events if e["event"] == "rl_worker_policy"]
    assert policies and all(e["hash_ok"] for e in policies), policies
    assert not any(e["event"] == "rl_worker_refused" for e in honest_events)
    done = next(e for e in honest_events if e["event"] == "rl_worker_done")
    assert done["finished"] and done["receipts"] == {"accepted": STEPS * PROMPTS * GROUP}, done

    def metric(name, labels=""):
        m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", metrics, re.M)
        assert m, f"{name}{labels} missing from /metrics"
        return float(m.group(1))

    assert metric("agora_rl_step") == STEPS
    assert metric("agora_rl_workers", '{state="banned"}') == 1
    assert metric("agora_rl_rollouts_total", '{verdict="accepted"}') == STEPS * PROMPTS * GROUP
    assert metric("agora_rl_rollouts_total", '{verdict="mismatch"}') >= 1
    assert metric("agora_rl_policy_bytes_total", '{kind="delta"}') > 0
    # The page (web/rl.html) renders /api/rl in the browser: it is the role's page, reading it.
    assert "<title>agora rl</title>" in page and "/api/rl" in page, page[:300]
    print(f"ok: {STEPS} updates, honest worker {honest['accepted']} accepted, cheater "
          f"({cheat}) banned with {strikes[keys['cheat']]} strikes, "
          f"{len(policies)} policy updates hash-checked")


if __name__ == "__main__":
    main()
