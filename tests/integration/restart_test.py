#!/usr/bin/env python3
"""A server killed with SIGKILL mid-run and started again loses nothing it told its members
(docs/async.md section 2, "Restarts").

    restart_test.py AGORA DATA_DIR OUT async|rl|swarm

async: `agora async serve --method lookahead` and two `agora async work` processes on loopback. Once
the server has accepted a few deliveries it is killed with SIGKILL (twice: once at a random
moment, once at the crash point between its tensor file and the save that names it), and
started again with the same arguments; the workers reconnect by themselves. Checked, from the
structured output only:
  - every restart resumes (an async_resume event) at a version at least the newest any worker
    had been told in a receipt before the kill: nothing a member heard of is forgotten;
  - the run finishes: the server exits 0 with its summary and final checkpoint;
  - theta moved once per accepted delivery across all the server's lives (lookahead: one
    update per delivery), so no accepted delivery was lost or applied twice;
  - every receipt a worker got for an accepted delivery is counted in the final summary;
  - the honest workers were never struck, and every parameter update they took matched the
    server's state hash.

rl: `agora rl serve --checkpoint-every 2` and an honest `agora rl work`. The learner is killed
with SIGKILL one update after a save, and started again. Checked:
  - it resumes (rl_resume) at its newest save: not before the last one it logged, not past
    the updates it had done;
  - the run finishes all its updates (the last rl_step is --steps), exits 0 and writes its
    checkpoint; the resume folder says the run finished;
  - the worker finishes, was never struck, and every policy update it took matched the
    learner's hash (one it held past the learner's save was replaced by a whole copy).

swarm: `agora swarm serve` and four `agora swarm peer` processes, two replicas of each stage of a
two-stage model. The coordinator is killed with SIGKILL twice (once at a random moment in a step,
once at the crash point after a save whose answers were not sent) and started again with the
same arguments; the peers carry on by themselves. Checked:
  - every restart restores (swarm_restored) at a step past every step logged before the kill;
  - no step is finished twice (each swarm_step once), and the run finishes all its steps;
  - every replica finishes at the last step, and the replicas of each stage end bit-identical.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network_run import free_port  # noqa: E402
from rl_network_test import make_base  # noqa: E402

SECONDS, H = 30, 2


def events(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # the last line of a killed writer
    return out


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def wait(what, predicate, seconds, proc=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            sys.exit(f"FAILED: the server exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    sys.exit(f"FAILED: timed out waiting for {what}")


def told_versions(logs):
    """The newest version any worker was told in an accepted receipt, and how many it got."""
    newest, accepted = 0, 0
    for path in logs:
        for e in events(path):
            if e["event"] == "async_worker_receipt" and e["verdict"] == "accepted":
                newest = max(newest, e["version"])
                accepted += 1
    return newest, accepted


def async_scenario(agora, data, out):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "bench", "async", "async.toml")
    sets = ["--set", f"data.dir={data}", "--set", f"diloco.inner_steps={H}",
            "--set", "train.eval_windows=4"]
    keys = {n: run([agora, "keygen", "--out", f"{out}/{n}.key"]).strip().split()[-1]
            for n in ("server", "w0", "w1")}
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server_out = f"{out}/server"
    log = f"{server_out}/events.jsonl"
    serve = [agora, "async", "serve", "--config", config, *sets, "--key", f"{out}/server.key",
             "--listen", endpoint, "--open", "--workers", "2", "--method", "lookahead",
             "--seconds", str(SECONDS), "--eval-every", "10", "--out", server_out]

    def start(env=None):
        return subprocess.Popen(serve, stdout=open(f"{out}/server.out", "a"),
                                stderr=subprocess.STDOUT, env=env)

    server = start()
    workers = []
    logs = [f"{out}/w{i}.jsonl" for i in range(2)]
    try:
        for i in range(2):
            workers.append(subprocess.Popen(
                [agora, "async", "work", "--config", config, *sets, "--key", f"{out}/w{i}.key",
                 "--server", endpoint, "--server-key", keys["server"], "--step-seconds", "0.1",
                 "--idle-timeout", "90", "--log", logs[i]],
                stdout=open(f"{out}/w{i}.out", "w"), stderr=subprocess.STDOUT))
        lives = []
        # Life 1: killed at a random moment once a few deliveries are in.
        wait("3 accepted deliveries", lambda: told_versions(logs)[1] >= 3, 120, server)
        time.sleep(0.7)
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(0.3)
        lives.append(told_versions(logs))
        # Life 2: killed between writing a tensor file and committing the save that names it.
        server = start(dict(os.environ, AGORA_CRASH_AT="async_store.tensors_written:2"))
        assert server.wait(timeout=120) != 0, "the crash point was never reached"
        time.sleep(0.3)
        lives.append(told_versions(logs))
        # Life 3: to the end.
        server = start()
        code = server.wait(timeout=240)
        assert code == 0, f"the server exited {code}: see {out}/server.out"
        for w in workers:
            w.wait(timeout=60)
    finally:
        for p in [server, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()

    log_events = events(log)
    resumes = [e for e in log_events if e["event"] == "async_resume"]
    assert len(resumes) == 2, f"expected two resumes, got {resumes}"
    for (newest, _), resume in zip(lives, resumes):
        assert resume["version"] >= newest, \
            f"resumed at version {resume['version']}, but a worker had been told {newest}"
        assert resume["workers"] == 2, resume
    summary = next(e for e in log_events if e["event"] == "async_summary")
    accepted = summary["verdicts"].get("accepted", 0)
    assert summary["updates"] == accepted, \
        f"{summary['updates']} updates for {accepted} accepted deliveries: {summary}"
    _, receipts = told_versions(logs)
    assert 0 < receipts <= accepted, f"workers got {receipts} receipts, the run counts {accepted}"
    assert set(summary["verdicts"]) <= {"accepted", "stale"}, summary["verdicts"]
    assert not summary["banned"], summary
    for path in logs:
        done = [e for e in events(path) if e["event"] == "async_worker_done"]
        assert done and done[0]["hash_mismatches"] == 0 and not done[0]["refused"], (path, done)
    evals = [e for e in log_events if e["event"] == "async_eval"]
    assert len(evals) >= 2 and evals[-1]["val_loss"] < evals[0]["val_loss"], evals
    assert os.path.exists(f"{server_out}/final/config.json"), "no final checkpoint"
    print(f"ok async: two kills, resumed at versions {[r['version'] for r in resumes]} "
          f"(workers had been told {[n for n, _ in lives]}), {summary['updates']} updates for "
          f"{accepted} accepted deliveries, {receipts} receipts")


RL_STEPS, RL_EVERY = 6, 2


def rl_scenario(agora, _data, out):
    base = make_base(agora, out)
    keys = {n: run([agora, "keygen", "--out", f"{out}/{n}.key"]).strip().split()[-1]
            for n in ("learner", "worker")}
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    learner_out = f"{out}/learner"
    log = f"{learner_out}/rl.jsonl"
    serve = [agora, "rl", "serve", "--checkpoint", base, "--key", f"{out}/learner.key",
             "--listen", endpoint, "--open", "--steps", str(RL_STEPS), "--prompts", "4",
             "--group", "4",
             "--eval-problems", "4", "--eval-interval", "0", "--reassign-after", "5",
             "--checkpoint-every", str(RL_EVERY), "--out", learner_out]

    def start():
        return subprocess.Popen(serve, stdout=open(f"{out}/learner.out", "a"),
                                stderr=subprocess.STDOUT)

    def steps_done():
        return max([e["step"] for e in events(log) if e["event"] == "rl_step"] or [0])

    def saved():
        return max([e["step"] for e in events(log) if e["event"] == "rl_saved"] or [0])

    learner = start()
    worker = subprocess.Popen(
        [agora, "rl", "work", "--key", f"{out}/worker.key", "--learner", endpoint,
         "--learner-key", keys["learner"], "--base", base, "--slots", "8",
         "--log", f"{out}/worker.jsonl", "--idle-timeout", "120"],
        stdout=open(f"{out}/worker.out", "w"), stderr=subprocess.STDOUT)
    try:
        wait("an update past a save", lambda: saved() >= RL_EVERY and steps_done() > saved(),
             300, learner)
        learner.send_signal(signal.SIGKILL)
        learner.wait()
        last_save, trained = saved(), steps_done()
        learner = start()
        code = learner.wait(timeout=300)
        assert code == 0, f"the learner exited {code}: see {out}/learner.out"
        worker.wait(timeout=60)
    finally:
        for p in (learner, worker):
            if p.poll() is None:
                p.kill()
                p.wait()
    log_events = events(log)
    resumes = [e for e in log_events if e["event"] == "rl_resume"]
    # The newest save: the last one logged, or one the kill cut off after its state.json
    # (before its event) and before the next update.
    assert len(resumes) == 1, resumes
    resumed = resumes[0]["step"]
    assert last_save <= resumed <= trained and resumed % RL_EVERY == 0, (resumed, last_save, trained)
    assert steps_done() == RL_STEPS, f"the run ended at update {steps_done()} of {RL_STEPS}"
    assert os.path.exists(f"{learner_out}/latest/config.json"), "no final checkpoint"
    with open(f"{learner_out}/resume/state.json") as f:
        assert json.load(f)["finished"], "the resume folder does not say the run finished"
    intake = [e for e in log_events if e["event"] == "rl_intake"][-1]
    assert not any(intake["strikes"].values()), intake
    done = [e for e in events(f"{out}/worker.jsonl") if e["event"] == "rl_worker_done"]
    assert done and done[0]["hash_mismatches"] == 0, done
    print(f"ok rl: killed after update {trained}, resumed at the save of update {resumed}, "
          f"finished {RL_STEPS} updates")


SWARM_STEPS = 16  # room after the second kill for a replica that lost an answer to catch up


def swarm_scenario(agora, data, out):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "configs", "swarm.toml")
    sets = ["--set", f"data.dir={data}", "--set", f"train.steps={SWARM_STEPS}",
            "--set", "pipeline.stages=2", "--set", "model.num_layers=2",
            "--set", "train.batch_size=16", "--set", "pipeline.micro_batches=8"]
    names = [f"p{i}" for i in range(4)]
    stage_of = {name: i // 2 for i, name in enumerate(names)}
    keys = {n: run([agora, "keygen", "--out", f"{out}/{n}.key"]).strip().split()[-1]
            for n in ["coordinator", *names]}
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log = f"{out}/coordinator/events.jsonl"
    serve = [agora, "swarm", "serve", "--config", config, *sets,
             "--key", f"{out}/coordinator.key", "--listen", endpoint, "--open", "--peers", "4",
             "--peer-timeout", "5", "--out", f"{out}/coordinator"]

    def start(env=None):
        return subprocess.Popen(serve, stdout=open(f"{out}/coordinator.out", "a"),
                                stderr=subprocess.STDOUT, env=env)

    def steps_logged():
        return [e["step"] for e in events(log) if e["event"] == "swarm_step"]

    coordinator = start()
    peers = [subprocess.Popen(
        [agora, "swarm", "peer", "--config", config, *sets, "--key", f"{out}/{n}.key",
         "--coordinator", endpoint, "--coordinator-key", keys["coordinator"],
         "--listen", "tcp://127.0.0.1:*", "--stage", str(stage_of[n]), "--pace-unit", "0.02",
         "--timeout", "30", "--events", f"{out}/{n}.jsonl"],
        stdout=open(f"{out}/{n}.out", "w"), stderr=subprocess.STDOUT) for n in names]
    lives = []
    try:
        # Life 1: killed in the middle of a step.
        wait("step 2", lambda: max(steps_logged() or [-1]) >= 2, 180, coordinator)
        time.sleep(0.4)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
        lives.append(max(steps_logged()))
        # Life 2: killed after a save, before the answers that tell it are sent.
        coordinator = start(dict(os.environ, AGORA_CRASH_AT="swarm_server.after_save:40"))
        assert coordinator.wait(timeout=180) != 0, "the crash point was never reached"
        lives.append(max(steps_logged()))
        # Life 3: to the end.
        coordinator = start()
        code = coordinator.wait(timeout=300)
        assert code == 0, f"the coordinator exited {code}: see {out}/coordinator.out"
        for n, p in zip(names, peers):
            assert p.wait(timeout=60) == 0, f"{n} failed: see {out}/{n}.out"
    finally:
        for p in [coordinator, *peers]:
            if p.poll() is None:
                p.kill()
                p.wait()

    log_events = events(log)
    restored = [e for e in log_events if e["event"] == "swarm_restored"]
    assert len(restored) == 2, restored
    for logged, r in zip(lives, restored):
        assert r["step"] > logged, f"restored at step {r['step']}, but step {logged} was logged"
        assert r["members"] == 4, r
    steps = steps_logged()
    assert len(steps) == len(set(steps)), f"a step finished twice: {steps}"
    assert max(steps) == SWARM_STEPS - 1, steps
    summary = [e for e in log_events if e["event"] == "swarm_summary"][-1]
    assert summary["steps"] == SWARM_STEPS and summary["restarts"] == 2, summary
    # The run's clock went on across the restarts: the time down counts, as waiting.
    down = sum(r["down_seconds"] for r in restored)
    assert summary["waiting_seconds"] >= down, (summary, down)
    assert len([e for e in log_events if e["event"] == "swarm_start"]) == 1, "the run started again"
    finish = {n: [e for e in events(f"{out}/{n}.jsonl") if e["event"] == "finish"][-1]
              for n in names}
    for name, f in finish.items():
        assert f["finished"] and f["version"] == SWARM_STEPS, (name, f)
    for s in range(2):
        hashes = {finish[n]["parameter_hash"] for n in names if stage_of[n] == s}
        assert len(hashes) == 1, (s, hashes)
    print(f"ok swarm: two kills, restored at steps {[r['step'] for r in restored]} (logged "
          f"before: {lives}), {SWARM_STEPS} steps, replicas of each stage identical")


def main():
    agora, data, out, scenario = sys.argv[1:5]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    {"async": async_scenario, "rl": rl_scenario, "swarm": swarm_scenario}[scenario](agora, data, out)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
