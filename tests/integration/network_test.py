#!/usr/bin/env python3
"""Decentralized runs with real processes on loopback: one scenario per invocation.

    network_test.py AGORA DATA_DIR SCENARIO

Each scenario starts `agora coordinator` and several `agora peer` processes (CURVE over
ZeroMQ, an allowlist, SQLite), does something to them (kill, add, slow, tamper, restart), and
asserts on outcomes read from their logs: the coordinator's JSON lines (one per finalized step)
and the peers' "state after N steps HASH" lines (hash_interval = 1: after every applied step).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "network.toml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    def __init__(self, agora, data, name, peers, steps, sets=()):
        self.agora, self.data = agora, data
        self.dir = tempfile.mkdtemp(prefix=f"agora-{name}-")
        self.steps = steps
        self.port = free_port()
        self.coordinator_key = self.keygen("coordinator")
        self.peer_keys = [self.keygen(f"peer-{i}") for i in range(peers)]
        with open(os.path.join(self.dir, "allowlist.txt"), "w") as f:
            f.write("\n".join(self.peer_keys) + "\n")
        self.sets = [f'network.listen="tcp://127.0.0.1:{self.port}"',
                     f'network.allowlist="{self.dir}/allowlist.txt"',
                     f'network.state_db="{self.dir}/coordinator.db"',
                     f"train.steps={steps}", *sets]
        self.coordinator = None
        self.peers = {}

    def keygen(self, name):
        out = subprocess.run([self.agora, "keygen", "--out", os.path.join(self.dir, name + ".key")],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def start_coordinator(self, extra=("--http", "off")):
        args = [self.agora, "coordinator", "--config", CONFIG, "--key",
                os.path.join(self.dir, "coordinator.key"), "--json", *extra]
        for s in self.sets:
            args += ["--set", s]
        out = open(os.path.join(self.dir, "coordinator.jsonl"), "a")
        err = open(os.path.join(self.dir, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(args, stdout=out, stderr=err)

    def start_peer(self, i, key=None, extra=()):
        key = key or os.path.join(self.dir, f"peer-{i}.key")
        args = [self.agora, "peer", "--coordinator", f"tcp://127.0.0.1:{self.port}",
                "--coordinator-key", self.coordinator_key, "--key", key, "--data", self.data,
                "--listen", "tcp://127.0.0.1:*", "--threads", "1",
                "--checkpoint-dir", os.path.join(self.dir, f"ckpt-{i}"), *extra]
        log = open(os.path.join(self.dir, f"peer-{i}.log"), "a")
        self.peers[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        return self.peers[i]

    def rows(self):
        path = os.path.join(self.dir, "coordinator.jsonl")
        rows = []
        if os.path.exists(path):
            for line in open(path):
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                rows.append(j)
        return rows

    def steps_final(self):
        return [r for r in self.rows() if r.get("event") == "step"]

    def events(self):
        return [r["text"] for r in self.rows() if r.get("event") == "log"]

    def wait_until(self, what, predicate, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if predicate():
                return
            if self.coordinator and self.coordinator.poll() not in (None, 0):
                self.fail(f"the coordinator exited with {self.coordinator.returncode} while "
                          f"waiting for {what}")
            time.sleep(0.2)
        self.fail(f"timed out after {timeout} s waiting for {what}")

    def wait_final(self, n, timeout=120):
        self.wait_until(f"{n} finalized steps", lambda: len(self.steps_final()) >= n, timeout)

    def wait_finished(self, timeout=90):
        self.wait_until("the coordinator to finish", lambda: self.coordinator.poll() is not None,
                        timeout)
        if self.coordinator.returncode != 0:
            self.fail(f"the coordinator exited with {self.coordinator.returncode}")
        for i, p in self.peers.items():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail(f"peer {i} did not exit after the run finished")

    def peer_log(self, i):
        return open(os.path.join(self.dir, f"peer-{i}.log")).read()

    def states(self, i):
        """applied steps -> state hash, from peer i's log."""
        return {int(m.group(1)): m.group(2)
                for m in re.finditer(r"state after (\d+) steps ([0-9a-f]{64})", self.peer_log(i))}

    def shares(self, i):
        return [int(m.group(1)) for m in re.finditer(r"loss \S+\s+(\d+) seqs", self.peer_log(i))]

    def check_identical(self, peers, at_least=1):
        """Every step that two or more of `peers` reported has one hash; returns the steps."""
        by_step = {}
        for i in peers:
            for step, h in self.states(i).items():
                by_step.setdefault(step, {})[i] = h
        shared = {s: hs for s, hs in by_step.items() if len(hs) >= 2}
        for step, hs in sorted(shared.items()):
            if len(set(hs.values())) != 1:
                self.fail(f"after step {step} the peers' parameters differ: {hs}")
        if len(shared) < at_least:
            self.fail(f"only {len(shared)} steps were reported by two or more peers")
        return sorted(shared)

    def check_loss_falls(self):
        rows = self.steps_final()
        losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
        if len(losses) < 4:
            self.fail(f"only {len(losses)} losses reported")
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        if not last < first - 0.3:
            self.fail(f"the loss did not fall: first steps {first:.3f}, last steps {last:.3f}")
        print(f"loss {first:.3f} -> {last:.3f} over {len(rows)} steps")

    def fail(self, message):
        self.stop()
        print(f"FAIL: {message}\n--- logs in {self.dir} ---")
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".jsonl")):
                text = open(os.path.join(self.dir, name)).read()
                print(f"--- {name} (last 25 lines) ---")
                print("\n".join(text.splitlines()[-25:]))
        sys.exit(1)

    def stop(self):
        for p in list(self.peers.values()) + [self.coordinator]:
            if p and p.poll() is None:
                p.kill()
                p.wait()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def scenario_train(agora, data):
    """Three peers train; the loss falls; after every finalized step all hashes are equal."""
    run = Run(agora, data, "train", peers=3, steps=25, sets=["network.min_peers=3"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_finished()
    run.check_loss_falls()
    steps = run.check_identical(range(3), at_least=25)
    if len(run.steps_final()) != 25:
        run.fail(f"{len(run.steps_final())} steps finalized, expected 25")
    if not any(os.path.exists(os.path.join(run.dir, f"ckpt-{i}", "latest")) for i in range(3)):
        run.fail("no checkpointer wrote a checkpoint")
    print(f"identical parameters on all 3 peers after each of {len(steps)} steps")
    run.cleanup()


def scenario_kill_peer(agora, data):
    """A peer killed with SIGKILL mid-round does not stall the run; others train its ranges."""
    run = Run(agora, data, "kill", peers=3, steps=24, sets=["network.min_peers=2"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_final(6)
    run.peers[2].send_signal(signal.SIGKILL)
    run.peers[2].wait()
    del run.peers[2]
    run.wait_finished()
    events = run.events()
    if not any("dropped" in e for e in events):
        run.fail("the killed peer was never dropped")
    if len(run.steps_final()) != 24:
        run.fail(f"{len(run.steps_final())} steps finalized, expected 24")
    requeued = [e for e in events if "no commit from" in e]
    after = run.shares(0)[8:] + run.shares(1)[8:]
    if not after or max(after) <= 8:
        run.fail(f"the survivors' shares did not grow after the kill: {after}")
    run.check_identical([0, 1], at_least=20)
    print(f"run finished without the killed peer; survivors' shares after the kill: {after[:6]}...;"
          f" {len(requeued)} round(s) closed without its commit (its ranges went back to the queue)")
    run.cleanup()


def scenario_restart_peer(agora, data):
    """A peer killed with SIGKILL and started again with the same key rejoins and catches up."""
    run = Run(agora, data, "rejoin", peers=3, steps=40, sets=["network.min_peers=2"])
    run.start_coordinator()
    for i in range(3):
        run.start_peer(i)
    run.wait_final(8)
    run.peers[2].send_signal(signal.SIGKILL)
    run.peers[2].wait()
    killed_at = max(run.states(2))
    time.sleep(1)
    run.start_peer(2)  # same key, same log (appended)
    run.wait_finished()
    later = [s for s in run.states(2) if s > killed_at + 1]
    if not later:
        run.fail("the restarted peer reported no state after rejoining")
    if len(run.peer_log(2).split("joined run")) < 3:
        run.fail("the restarted peer did not join again")
    run.check_identical(range(3), at_least=30)
    print(f"killed after step {killed_at}, rejoined with the same key, matched the majority at "
          f"{len(later)} later steps")
    run.cleanup()


def scenario_all_leave(agora, data):
    """Every peer dies: restarted, the run goes back to its newest checkpoint and finishes."""
    run = Run(agora, data, "all-leave", peers=2, steps=30,
              sets=["network.min_peers=2", "network.checkpointers=2",
                    "train.checkpoint_interval=10"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.wait_final(14)
    for i in (0, 1):
        run.peers[i].send_signal(signal.SIGKILL)
        run.peers[i].wait()
    run.wait_until("both peers to be dropped",
                   lambda: sum("dropped" in e for e in run.events()) >= 2, 30)
    run.start_peer(0)
    run.start_peer(1)
    run.wait_finished()
    if not any("restarts from the checkpoint" in e for e in run.events()):
        run.fail("the run did not go back to its checkpoint")
    # The first to rejoin brings its checkpoint; the other loads its own or fetches it from the
    # first, whichever the coordinator's record allows when it joins.
    loaded = [i for i in (0, 1) if "parameters after step 10 loaded from" in run.peer_log(i)]
    fetched = [i for i in (0, 1) if "fetching the parameters after step 10" in run.peer_log(i)]
    if not loaded or len(set(loaded + fetched)) != 2:
        run.fail(f"loaded the checkpoint: {loaded}; fetched it from a member: {fetched}")
    steps = [r["step"] for r in run.steps_final()]
    if steps[-1] != 29:
        run.fail(f"the run did not finish all 30 steps: {steps[-5:]}")
    run.check_identical([0, 1], at_least=25)
    print(f"both peers killed after 14 steps; restarted, the run went back to the checkpoint "
          f"after step 10 (loaded by {loaded}, fetched by {fetched}) and finished identical")
    run.cleanup()


def scenario_join(agora, data):
    """A peer that joins mid-run fetches the parameters, catches up and matches the majority."""
    run = Run(agora, data, "join", peers=3, steps=40, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.wait_final(12)
    run.start_peer(2)
    run.wait_finished()
    log = run.peer_log(2)
    if "fetching the parameters after step" not in log:
        run.fail("the joiner did not fetch the parameters from the members")
    joined_at = min(run.states(2))
    if joined_at == 0:
        run.fail("the joiner started from step 0 instead of the current state")
    trained = len(run.shares(2))
    if trained == 0:
        run.fail("the joiner never trained a round")
    run.check_identical(range(3), at_least=30)
    print(f"joiner started from the state after step {joined_at}, trained {trained} rounds, "
          f"and matched the majority's hash at every later step")
    run.cleanup()


def scenario_coordinator_restart(agora, data):
    """The coordinator killed with SIGKILL and restarted resumes without losing a final step."""
    run = Run(agora, data, "restart", peers=2, steps=30, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.wait_final(8)
    run.coordinator.send_signal(signal.SIGKILL)
    run.coordinator.wait()
    before = len(run.steps_final())
    time.sleep(1.5)
    run.start_coordinator()
    run.wait_finished()
    steps = sorted(r["step"] for r in run.steps_final())
    if steps != sorted(set(steps)) or steps[-1] != 29:
        run.fail(f"finalized steps after the restart are not 0..29 exactly once: {steps}")
    if "resumed at step" not in open(os.path.join(run.dir, "coordinator.log")).read():
        run.fail("the restarted coordinator did not resume from its database")
    run.check_identical([0, 1], at_least=28)
    print(f"killed after {before} final steps; resumed and finished all 30 with identical peers")
    run.cleanup()


def scenario_allowlist(agora, data):
    """A key outside the allowlist is refused; the run goes on without it."""
    run = Run(agora, data, "allowlist", peers=2, steps=6, sets=["network.min_peers=2"])
    stranger = run.keygen("stranger")
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    intruder = run.start_peer(9, key=os.path.join(run.dir, "stranger.key"),
                              extra=["--join-timeout", "6"])
    code = intruder.wait(timeout=60)
    del run.peers[9]
    if code == 0:
        run.fail("a peer whose key is not on the allowlist was let in")
    if "allowlist" not in run.peer_log(9):
        run.fail("the refused peer's error does not mention the allowlist")
    run.wait_finished()
    if any(stranger[:8] in e for e in run.events()):
        run.fail("the stranger's key reached the coordinator's state machine")
    print("the stranger never got past the CURVE handshake; the run finished without it")
    run.cleanup()


def scenario_tamper(agora, data):
    """A peer committing malformed payloads is rejected by the others, struck and dropped."""
    run = Run(agora, data, "tamper", peers=3, steps=16, sets=["network.min_peers=2"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.start_peer(2, extra=["--misbehave", "garbage-payload"])
    run.wait_finished()
    events = run.events()
    bad = run.peer_keys[2][:8]
    if not any(bad in e and "strike" in e for e in events):
        run.fail(f"the tampering peer {bad} was never struck")
    if not any(bad in e and "dropped" in e for e in events):
        run.fail(f"the tampering peer {bad} was never dropped")
    run.check_identical([0, 1], at_least=14)
    print(f"tampering peer {bad} struck and dropped; honest peers identical at every step")
    run.cleanup()


def scenario_slow_peer(agora, data):
    """A peer slowed on purpose (3x) receives a smaller share of each batch."""
    run = Run(agora, data, "slow", peers=3, steps=20, sets=["network.min_peers=3"])
    run.start_coordinator()
    run.start_peer(0)
    run.start_peer(1)
    run.start_peer(2, extra=["--slowdown", "3"])
    run.wait_finished()
    fast = run.shares(0)[5:] + run.shares(1)[5:]
    slow = run.shares(2)[5:]
    if not fast or not slow:
        run.fail("missing per-round shares in the logs")
    mean_fast, mean_slow = sum(fast) / len(fast), sum(slow) / len(slow)
    if not mean_slow < 0.7 * mean_fast:
        run.fail(f"the slow peer's share ({mean_slow:.1f}) is not clearly below the others' "
                 f"({mean_fast:.1f})")
    run.check_identical(range(3), at_least=18)
    print(f"shares after warm-up: fast peers {mean_fast:.1f} sequences, slow peer {mean_slow:.1f}")
    run.cleanup()


def scenario_tst(agora, data):
    """Token superposition in a decentralized run: every peer trains on bags of 2 for the first
    half of the steps and switches at the same step; the parameters stay identical throughout."""
    run = Run(agora, data, "tst", peers=2, steps=12, sets=["tst.bag=2", "tst.fraction=0.5"])
    run.start_coordinator()
    for i in range(2):
        run.start_peer(i)
    run.wait_finished()
    steps = run.check_identical(range(2), at_least=12)
    for i in range(2):
        switched = re.findall(r"step\s+(\d+)\s+token superposition ends", run.peer_log(i))
        if switched != ["6"]:
            run.fail(f"peer {i} logged the switch at steps {switched}, expected [6]")
    if not any("step 6: token superposition ends" in e for e in run.events()):
        run.fail("the coordinator's events do not show the switch at step 6")
    print(f"both peers switched at step 6; identical parameters after each of {len(steps)} steps")
    run.cleanup()


SCENARIOS = {
    "train": scenario_train,
    "kill_peer": scenario_kill_peer,
    "join": scenario_join,
    "restart_peer": scenario_restart_peer,
    "all_leave": scenario_all_leave,
    "coordinator_restart": scenario_coordinator_restart,
    "allowlist": scenario_allowlist,
    "tamper": scenario_tamper,
    "slow_peer": scenario_slow_peer,
    "tst": scenario_tst,
}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in SCENARIOS:
        sys.exit(f"usage: network_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}}")
    SCENARIOS[sys.argv[3]](sys.argv[1], sys.argv[2])
