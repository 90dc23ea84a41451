#!/usr/bin/env python3
"""Pipeline stages as real processes (docs/pipeline.md): `agora stage` x S on loopback.

    pipeline_test.py AGORA DATA SCENARIO

  gpipe_int8       3 stage processes, synchronous schedule, int8 boundaries: every stage ends
                   with the parameters the in-process pipeline (`agora train`, same config)
                   computes, bit for bit, the losses are the same, and the stages' files merge
                   (agora merge-stages) into a checkpoint that evaluates as the in-process one.
                   Stages 1 and 2 hold no copy of the data: they fetch it from an
                   `agora data serve` that admits the three stages' keys (allowlist), into
                   folders that end holding the run's data hash.
  async_subspace   the same with the asynchronous 1F1B schedule, NAdam and subspace boundaries.
  stage_killed     stage 1 is SIGKILLed mid-run: stages 0 and 2 stop on their own within their
                   timeout, with an error event naming stage 1.
  resume_gpipe     a run checkpointing every 4 of 12 steps, stage 1 killed (a crash point) after
                   its 10th step: restarted with --resume, every stage resumes at step 8 and
                   ends bit-identical to the in-process pipeline that never stopped.
  resume_async     the same under async 1F1B, NAdam and subspace boundaries (what resumes there:
                   stashed forwards and the messages in flight), stage 0 killed between the two
                   files of its step-8 checkpoint: the stages resume at step 4, the newest step
                   all of them hold whole, and end bit-identical too.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from network_run import free_port  # noqa: E402

CONFIG = os.path.join(HERE, "pipeline.toml")
STAGES = 3


def events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Pipeline:
    def __init__(self, agora, data, sets):
        self.agora, self.data, self.sets = agora, data, [f"data.dir={data}", *sets]
        self.dir = tempfile.mkdtemp(prefix="agora-pipeline-")
        self.keys = [self.keygen(i) for i in range(STAGES)]
        self.ports = [free_port() for _ in range(STAGES)]
        self.procs = []
        self.server = None  # an `agora data serve`, when stages fetch their data
        self.fetching = {}  # stage -> the folder it fetches the data into

    def serve_data(self, stages):
        """Starts `agora data serve` for the stages' keys; `stages` fetch from it."""
        self.data_hash = subprocess.run([self.agora, "data", "hash", self.data], check=True,
                                        capture_output=True, text=True).stdout.strip()
        self.sets.append(f"data.hash={self.data_hash}")
        allow = os.path.join(self.dir, "allowlist")
        with open(allow, "w") as f:
            f.write("".join(k + "\n" for k in self.keys))
        self.server_key = self.keygen("data")
        self.server_endpoint = f"tcp://127.0.0.1:{free_port()}"
        log = open(os.path.join(self.dir, "data-serve.log"), "w")
        self.server = subprocess.Popen(
            [self.agora, "data", "serve", "--data", self.data, "--key",
             os.path.join(self.dir, "stage-data.key"), "--listen", self.server_endpoint,
             "--allowlist", allow, "--events", os.path.join(self.dir, "data-serve.jsonl")],
            stdout=log, stderr=log)
        self.fetching = {i: os.path.join(self.dir, f"data-{i}") for i in stages}

    def stop_data(self):
        if self.server is not None:
            self.server.send_signal(signal.SIGINT)
            self.server.wait(timeout=30)

    def keygen(self, i):
        out = subprocess.run([self.agora, "keygen", "--out", os.path.join(self.dir, f"stage-{i}.key")],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def start(self, timeout=60, resume=False, crash_at=None):
        """Launches the stages; crash_at: {stage: AGORA_CRASH_AT value}."""
        self.procs = []
        # The last stage first: each connects to the next, which ZeroMQ retries until it is up.
        for i in reversed(range(STAGES)):
            args = [self.agora, "stage", "--config", CONFIG, "--stage", str(i), "--key",
                    os.path.join(self.dir, f"stage-{i}.key"), "--events",
                    os.path.join(self.dir, f"stage-{i}.jsonl"), "--timeout", str(timeout),
                    "--out", os.path.join(self.dir, "stages")]
            if i > 0:
                args += ["--listen", f"tcp://127.0.0.1:{self.ports[i]}", "--prev-key",
                         self.keys[i - 1]]
            if i < STAGES - 1:
                args += ["--next", f"tcp://127.0.0.1:{self.ports[i + 1]}", "--next-key",
                         self.keys[i + 1]]
            if i in self.fetching:
                args += ["--data-from", self.server_endpoint, "--data-from-key", self.server_key,
                         "--data-cache", self.fetching[i]]
            if resume:
                args.append("--resume")
            for s in self.sets:
                args += ["--set", s]
            env = dict(os.environ)
            env.pop("AGORA_CRASH_AT", None)
            if crash_at and i in crash_at:
                env["AGORA_CRASH_AT"] = crash_at[i]
            err = open(os.path.join(self.dir, f"stage-{i}.log"), "a")
            self.procs.insert(0, subprocess.Popen(args, stdout=err, stderr=err, env=env))

    def wait(self, limit):
        deadline = time.time() + limit
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.fail(f"stage {i} did not finish within {limit} s")
        return [p.returncode for p in self.procs]

    def stage_events(self, i):
        return events(os.path.join(self.dir, f"stage-{i}.jsonl"))

    def fail(self, message):
        for p in self.procs + ([self.server] if self.server else []):
            if p.poll() is None:
                p.kill()
        for i in [*range(STAGES), "data-serve"]:
            log = os.path.join(self.dir, f"stage-{i}.log" if i != "data-serve" else
                               "data-serve.log")
            if os.path.exists(log):
                print(f"--- stage {i} log:\n" + open(log).read()[-3000:], file=sys.stderr)
        sys.exit(f"FAIL: {message} (files in {self.dir})")

    def simulate(self):
        """The same run in one process (pipeline/simulation.h): its finish event."""
        out = os.path.join(self.dir, "simulated")
        args = [self.agora, "train", "--config", CONFIG, "--quiet", "--set", f"train.out_dir={out}"]
        for s in self.sets:
            args += ["--set", s]
        subprocess.run(args, check=True, capture_output=True, text=True)
        return events(os.path.join(out, "pipeline.jsonl"))


def same_as_simulation(agora, data, sets, fetch=()):
    run = Pipeline(agora, data, sets)
    if fetch:
        run.serve_data(fetch)
    run.start()
    codes = run.wait(240)
    if any(codes):
        run.fail(f"stage exit codes {codes}")
    for i, folder in run.fetching.items():
        held = subprocess.run([agora, "data", "hash", folder], capture_output=True,
                              text=True).stdout.strip()
        if held != run.data_hash:
            run.fail(f"stage {i}'s fetched folder hashes to {held!r}, the run's data to "
                     f"{run.data_hash}")
    if fetch:
        run.stop_data()
        stop = [e for e in events(os.path.join(run.dir, "data-serve.jsonl"))
                if e["event"] == "data_serve_stop"]
        if not stop or stop[0]["chunks"] == 0:
            run.fail(f"the data server reports no chunks served: {stop}")
    simulated = run.simulate()
    finish = next(e for e in simulated if e["event"] == "finish")
    for i in range(STAGES):
        mine = next(e for e in run.stage_events(i) if e["event"] == "finish")
        if mine["parameter_hash"] != finish["stage_hashes"][i]:
            run.fail(f"stage {i} ended with parameters {mine['parameter_hash'][:16]}, the "
                     f"in-process pipeline with {finish['stage_hashes'][i][:16]}")
    # The last stage's losses are the simulation's, step for step.
    losses = [e["loss"] for e in run.stage_events(STAGES - 1) if e["event"] == "step"]
    expected = [e["loss"] for e in simulated if e["event"] == "step"]
    if losses != expected:
        run.fail(f"losses {losses} differ from the in-process pipeline's {expected}")
    # The stages' files merge into one checkpoint that evaluates as the in-process one does.
    merged = os.path.join(run.dir, "merged")
    args = [agora, "merge-stages", "--config", CONFIG, "--stages", os.path.join(run.dir, "stages"),
            "--out", merged]
    for s in run.sets:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True, text=True)
    losses_by = {}
    for name, checkpoint in (("merged", merged), ("in-process", finish["checkpoint"])):
        out = subprocess.run([agora, "eval", "--checkpoint", checkpoint, "--data",
                              os.path.join(data, "val_000000.bin"), "--max-windows", "8",
                              "--device", "cpu", "--json"],
                             check=True, capture_output=True, text=True).stdout
        losses_by[name] = json.loads(out)["val_loss"]
    if losses_by["merged"] != losses_by["in-process"]:
        run.fail(f"the merged stage files evaluate to {losses_by['merged']}, the in-process "
                 f"checkpoint to {losses_by['in-process']}")
    fetched = f", stages {list(fetch)} fetching their data" if fetch else ""
    print(f"OK: {STAGES} stage processes ended bit-identical to the in-process pipeline "
          f"({len(losses)} steps, {sets}{fetched})")
    shutil.rmtree(run.dir, ignore_errors=True)


def stage_killed(agora, data):
    timeout = 8
    run = Pipeline(agora, data, ["train.steps=100000"])
    run.start(timeout=timeout)
    # Let the pipeline run a few steps, then kill the middle stage.
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(os.path.join(run.dir, "stage-2.jsonl")) and any(
                e["event"] == "step" for e in run.stage_events(2)):
            break
        time.sleep(0.2)
    else:
        run.fail("the pipeline trained no step")
    run.procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    codes = run.wait(timeout + 60)
    took = time.time() - killed
    for i in (0, 2):
        if codes[i] == 0:
            run.fail(f"stage {i} exited 0 although stage 1 was killed")
        errors = [e for e in run.stage_events(i) if e["event"] == "error"]
        if not errors or errors[-1]["blamed"] != 1:
            run.fail(f"stage {i}'s error event does not name stage 1: {errors}")
    if took > timeout + 30:
        run.fail(f"the stages took {took:.0f} s to stop (timeout {timeout} s)")
    print(f"OK: stage 1 killed; stages 0 and 2 stopped in {took:.1f} s naming stage 1")
    shutil.rmtree(run.dir, ignore_errors=True)


def resumed(agora, data, sets, crash_at, resumes_at):
    run = Pipeline(agora, data, [*sets, "train.steps=12", "train.checkpoint_interval=4"])
    run.start(timeout=8, crash_at=crash_at)
    codes = run.wait(120)
    for i in crash_at:
        if codes[i] != -signal.SIGKILL:
            run.fail(f"stage {i} exited {codes[i]}, expected its crash point "
                     f"{crash_at[i]} to kill it")
    run.start(timeout=60, resume=True)
    codes = run.wait(240)
    if any(codes):
        run.fail(f"the resumed stages exited {codes}")
    starts = [[e["step"] for e in run.stage_events(i) if e["event"] == "resume"]
              for i in range(STAGES)]
    if starts != [[resumes_at]] * STAGES:
        run.fail(f"the stages resumed at {starts}, expected each once at step {resumes_at} "
                 f"(the newest checkpoint all of them hold whole)")
    finish = next(e for e in run.simulate() if e["event"] == "finish")
    for i in range(STAGES):
        mine = [e for e in run.stage_events(i) if e["event"] == "finish"][-1]
        if mine["resumed_at"] != resumes_at or \
                mine["parameter_hash"] != finish["stage_hashes"][i]:
            run.fail(f"stage {i} ended (resumed at {mine['resumed_at']}) with parameters "
                     f"{mine['parameter_hash'][:16]}, the in-process pipeline that never "
                     f"stopped with {finish['stage_hashes'][i][:16]}")
    print(f"OK: crashed by {crash_at}, resumed at step {resumes_at}, ended bit-identical to "
          f"the uninterrupted pipeline ({sets})")
    shutil.rmtree(run.dir, ignore_errors=True)


def main():
    agora, data, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    if scenario == "gpipe_int8":
        same_as_simulation(agora, data, ["pipeline.codec=int8"], fetch=(1, 2))
    elif scenario == "async_subspace":
        same_as_simulation(agora, data, ["pipeline.schedule=async", "pipeline.optimizer=nadam",
                                         "pipeline.codec=subspace", "pipeline.subspace_rank=16"])
    elif scenario == "stage_killed":
        stage_killed(agora, data)
    # The resumed runs use the two codecs the scenarios above do not (bfloat16, columns), so
    # every codec crosses real stage links once, bit-identical to the in-process pipeline.
    elif scenario == "resume_gpipe":
        resumed(agora, data, ["pipeline.codec=bfloat16"], {1: "stage.after_step:10"}, 8)
    elif scenario == "resume_async":
        resumed(agora, data, ["pipeline.schedule=async", "pipeline.optimizer=nadam",
                              "pipeline.codec=columns", "pipeline.columns_kept=0.25"],
                {0: "stage.checkpoint.after_state:2"}, 4)
    else:
        sys.exit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
