#!/usr/bin/env python3
"""A fuzzing campaign: every libFuzzer target of a fuzz build, for a fixed budget, seeded from the
repository's corpora; reports executions, coverage and crashes per target.

    scripts/fuzz_campaign.py --build build-fuzz --seconds 600
    scripts/fuzz_campaign.py --runs 10000000 --seconds 1500 --targets envelope_fuzz,payload_fuzz
    scripts/fuzz_campaign.py --seconds 600 --add-seeds      # findings become seeds

Each target runs as one libFuzzer process on a fresh work corpus (a copy of
tests/fuzz/corpus/<name>/) with the repository corpus as a second, read-only folder, under
-rss_limit_mb and -timeout, with -artifact_prefix into <out>/<name>/. The budget is --seconds
(libFuzzer's -max_total_time), --runs (its -runs) or both (whichever comes first). While it runs
it prints a line at each target's start and finish with the campaign's ETA, and one every
--progress seconds with the executions so far. At the end it prints a table and writes
<out>/fuzz_campaign.json.

A crash is a crash-*, leak-*, timeout-* or oom-* artifact, or a nonzero exit of the fuzzer
(slow-unit-* artifacts are counted apart). A timeout-* input is first run again alone: one that
finishes within --timeout was the machine's load (a niced fuzzer starved by busy neighbours), and
is reported as an unconfirmed timeout, not a crash (the target still stopped there, short of its
budget: "stopped_early" in the JSON). The artifacts stay in <out>/<name>/ (minimize one with
`<binary> -minimize_crash=1 -runs=100000 <artifact>`), and the script exits with status 1 when
any target crashed.

With --add-seeds, findings become seeds: after a target's run, the inputs of its work corpus that
cover edges the repository corpus does not are added to tests/fuzz/corpus/<name>/, at most
--max-seeds of them (those adding the most edges, picked greedily from the per-input coverage of a
libFuzzer -set_cover_merge=1 run), never the whole work corpus. --merge-only does the same for the
work corpora an earlier campaign left in --out, without fuzzing. Crash artifacts are never added
as seeds (a crash input belongs in the corpus only with the fix of its bug), and a target that
crashed adds none.

Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASH_PREFIXES = ("crash-", "leak-", "timeout-", "oom-")
SLOW_PREFIX = "slow-unit-"  # an input over -report_slow_units seconds: reported, not a crash

# "#1048576	pulse  cov: 1234 ft: 5678 corp: 90/12Kb lim: 4096 exec/s: 34952 rss: 512Mb"
STATUS_RE = re.compile(r"^#(\d+)\s+(\w+)\s+(.*)$")
FIELD_RE = {
    "cov": re.compile(r"\bcov: (\d+)"),
    "ft": re.compile(r"\bft: (\d+)"),
    "corp": re.compile(r"\bcorp: (\d+)/(\d+)([bKM]?)b?"),
    "exec_per_sec": re.compile(r"\bexec/s: (\d+)"),
    "rss_mb": re.compile(r"\brss: (\d+)Mb"),
}
FINAL_RE = re.compile(r"^stat::(\w+):\s+(\d+)")
SIZE_UNIT = {"": 1, "b": 1, "K": 1024, "M": 1024 * 1024}


def fail(message):
    print(f"fuzz_campaign: {message}", file=sys.stderr)
    sys.exit(2)


def human_seconds(seconds):
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def human_count(n):
    if n is None:
        return "?"
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 10_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def find_binary(build, name):
    for sub in ("tests/fuzz", "tests"):
        path = os.path.join(build, sub, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def git_revision():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


class Target:
    """One target's run: its state while it runs and its figures after."""

    def __init__(self, name, binary, seeds, out):
        self.name = name
        self.binary = binary
        self.seeds = seeds
        self.dir = os.path.join(out, name)
        self.work = os.path.join(self.dir, "corpus")
        self.log_path = os.path.join(self.dir, "fuzz.log")
        self.lock = threading.Lock()
        self.process = None
        self.started = None
        self.finished = None
        self.execs = None  # from the last status line
        self.execs_at = None  # when that line came
        self.exec_per_sec = None
        self.cov = self.ft = self.corp_units = self.corp_bytes = self.rss_mb = None
        self.final = {}
        self.returncode = None
        self.crashes = []
        self.slow_units = []
        # timeout-* artifacts that ran within -timeout when run again alone: the machine was
        # too loaded (a niced fuzzer beside a busy one), not the input too slow.
        self.unconfirmed_timeouts = []
        self.seeds_added = []
        self.error = None
        self.merge_error = None
        self.seed_edges = None  # with --add-seeds: edges of the corpus, new ones, new ones seeded
        self.interrupted = False  # stopped by the campaign's Ctrl-C
        self.budget_seconds = 0  # set by main: --seconds, or this target's --seconds-for

    def command(self, args):
        cmd = [self.binary, "-print_final_stats=1", f"-rss_limit_mb={args.rss_limit_mb}",
               f"-timeout={args.timeout}", f"-artifact_prefix={self.dir}/"]
        if self.budget_seconds:
            cmd.append(f"-max_total_time={self.budget_seconds}")
        if args.runs:
            cmd.append(f"-runs={args.runs}")
        cmd += args.fuzzer_arg
        cmd.append(self.work)
        if os.path.isdir(self.seeds):
            cmd.append(self.seeds)
        return cmd

    def parse_line(self, line):
        match = STATUS_RE.match(line)
        if match:
            with self.lock:
                self.execs = int(match.group(1))
                self.execs_at = time.monotonic()
                rest = match.group(3)
                for key in ("cov", "ft", "exec_per_sec", "rss_mb"):
                    found = FIELD_RE[key].search(rest)
                    if found:
                        setattr(self, key, int(found.group(1)))
                found = FIELD_RE["corp"].search(rest)
                if found:
                    self.corp_units = int(found.group(1))
                    self.corp_bytes = int(found.group(2)) * SIZE_UNIT[found.group(3)]
            return
        match = FINAL_RE.match(line)
        if match:
            with self.lock:
                self.final[match.group(1)] = int(match.group(2))

    def execs_now(self):
        """Executions so far: the last status line's count, carried on at its rate."""
        with self.lock:
            if self.execs is None:
                return None
            if self.finished is not None or not self.exec_per_sec:
                return self.execs
            return self.execs + int(self.exec_per_sec * (time.monotonic() - self.execs_at))

    def executions(self):
        return self.final.get("number_of_executed_units", self.execs)

    def seconds(self):
        if self.started is None:
            return None
        return (self.finished or time.monotonic()) - self.started

    def remaining_estimate(self, args):
        """Seconds left in this target's budget (None when unknown)."""
        elapsed = self.seconds() or 0.0
        estimates = []
        if self.budget_seconds:
            estimates.append(max(0.0, self.budget_seconds - elapsed))
        if args.runs:
            execs = self.execs_now()
            rate = self.exec_per_sec
            if execs is not None and rate:
                estimates.append(max(0.0, (args.runs - execs) / rate))
        return min(estimates) if estimates else None

    def result(self):
        execs = self.executions()
        secs = self.seconds()
        return {
            "target": self.name,
            "binary": self.binary,
            "executions": execs,
            "exec_per_sec": (self.final.get("average_exec_per_sec")
                             or (int(execs / secs) if execs and secs else None)),
            "cov": self.cov,
            "ft": self.ft,
            "corpus_units": self.corp_units,
            "corpus_bytes": self.corp_bytes,
            "new_units_added": self.final.get("new_units_added"),
            "peak_rss_mb": self.final.get("peak_rss_mb", self.rss_mb),
            "slowest_unit_time_sec": self.final.get("slowest_unit_time_sec"),
            "seconds": round(secs, 1) if secs is not None else None,
            "budget_seconds": self.budget_seconds or None,
            "exit_code": self.returncode,
            "interrupted": self.interrupted,
            "crashes": len(self.crashes) or (1 if self.crashed() and self.returncode else 0),
            "crash_artifacts": self.crashes,
            "unconfirmed_timeouts": self.unconfirmed_timeouts,
            # libFuzzer stops at a timeout: the target ran short of its budget.
            "stopped_early": bool(self.unconfirmed_timeouts),
            "slow_units": self.slow_units,
            "seeds_added": self.seeds_added,
            "seed_edges": self.seed_edges,
            "log": self.log_path,
            "error": self.error,
            "merge_error": self.merge_error,
        }

    def crashed(self):
        if (self.crashes == [] and self.unconfirmed_timeouts and self.returncode == 70
                and self.error is None):
            return False  # libFuzzer's timeout exit, for a unit that ran in time alone
        # 72 is libFuzzer's exit status when stopped by SIGINT (-interrupted_exitcode).
        ok_codes = (None, 0, 72) if self.interrupted else (None, 0)
        return bool(self.crashes) or (self.returncode not in ok_codes) or self.error is not None


class MergeError(Exception):
    pass


def read_merge_control(path):
    """The files of a libFuzzer merge control file, how many of them are the first corpus, and
    each file's coverage (PC indices) by index."""
    with open(path) as f:
        lines = f.read().splitlines()
    count, first = int(lines[0]), int(lines[1])
    files = lines[2:2 + count]
    cov = {}
    for line in lines[2 + count:]:
        if line.startswith("COV "):
            parts = line.split()
            cov[int(parts[1])] = set(map(int, parts[2:]))
    return files, first, cov


def merge_seeds(target, args):
    """Picks, from the work corpus, at most args.max_seeds inputs that cover edges the repository
    corpus does not, greedily (the most new edges first, the smaller input on a tie), and copies
    them into the repository corpus named by their SHA-1 as libFuzzer names them. The coverage
    comes from a libFuzzer set-cover merge (-set_cover_merge=1 writes each input's whole coverage
    into its control file) of the work corpus into a scratch copy of the repository corpus, so the
    repository corpus itself is only ever added to. Returns the names added."""
    import hashlib

    base = os.path.join(target.dir, "merge-base")
    control = os.path.join(target.dir, "merge.control")
    shutil.rmtree(base, ignore_errors=True)
    if os.path.isdir(target.seeds):
        shutil.copytree(target.seeds, base)
    else:
        os.makedirs(base)
    if os.path.exists(control):
        os.remove(control)
    cmd = [target.binary, "-set_cover_merge=1", f"-rss_limit_mb={args.rss_limit_mb}",
           f"-timeout={args.timeout}", f"-merge_control_file={control}", base, target.work]
    if args.nice:
        cmd = ["nice", "-n", str(args.nice)] + cmd
    merge_log = os.path.join(target.dir, "merge.log")
    with open(merge_log, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=target.dir).returncode
    if rc != 0 or not os.path.exists(control):
        raise MergeError(f"merge failed (exit {rc}); see {merge_log}")
    files, first, cov = read_merge_control(control)
    covered = set()
    for i in range(first):
        covered |= cov.get(i, set())
    candidates = {i: cov[i] - covered for i in range(first, len(files))
                  if cov.get(i, set()) - covered}
    new_edges = set().union(*candidates.values()) if candidates else set()
    base_edges = len(covered)
    sizes = {i: os.path.getsize(files[i]) for i in candidates}
    chosen = []
    while candidates and len(chosen) < args.max_seeds:
        best = max(candidates, key=lambda i: (len(candidates[i] - covered), -sizes[i]))
        gain = candidates.pop(best) - covered
        if not gain:
            break
        covered |= gain
        chosen.append(best)
    if chosen:
        os.makedirs(target.seeds, exist_ok=True)
    added = []
    for i in chosen:
        with open(files[i], "rb") as f:
            data = f.read()
        name = hashlib.sha1(data).hexdigest()
        path = os.path.join(target.seeds, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
            added.append(name)
    shutil.rmtree(base, ignore_errors=True)
    target.seed_edges = {"corpus_edges": base_edges, "new_edges": len(new_edges),
                         "new_edges_seeded": len(covered) - base_edges}
    return sorted(added)


class Campaign:
    def __init__(self, args, targets):
        self.args = args
        self.targets = targets
        self.pending = list(targets)
        self.running = []
        self.done = []
        self.lock = threading.Lock()
        self.interrupted = False
        self.start = time.monotonic()

    def log(self, message):
        stamp = human_seconds(time.monotonic() - self.start)
        print(f"[{stamp:>7}] {message}", flush=True)

    def eta(self):
        """Seconds until the campaign ends, or None when the budget is executions and some target
        has not reported a rate yet."""
        with self.lock:
            running = list(self.running)
            pending = list(self.pending)
        lanes = [t.remaining_estimate(self.args) for t in running]
        if any(x is None for x in lanes):
            return None
        if pending:
            if not all(t.budget_seconds for t in pending):
                return None
            lanes += [0.0] * (self.args.jobs - len(lanes))
            for t in pending:  # each pending target takes the lane that frees first
                lanes.sort()
                lanes[0] += t.budget_seconds
        return max(lanes) if lanes else 0.0

    def eta_text(self):
        eta = self.eta()
        if eta is None:
            return "campaign ETA ?"
        bound = "≤" if self.args.runs else ""
        return f"campaign ETA {bound}{human_seconds(eta)}"

    def run_target(self, target):
        args = self.args
        shutil.rmtree(target.dir, ignore_errors=True)
        os.makedirs(target.dir)
        if os.path.isdir(target.seeds):
            shutil.copytree(target.seeds, target.work)
        else:
            os.makedirs(target.work)
        cmd = target.command(args)
        if args.nice:
            cmd = ["nice", "-n", str(args.nice)] + cmd
        target.started = time.monotonic()
        self.log(f"start  {target.name}  ({self.eta_text()})")
        try:
            with open(target.log_path, "w") as log:
                log.write("$ " + " ".join(cmd) + "\n")
                target.process = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True,
                                                  errors="replace", cwd=target.dir)
                for line in target.process.stdout:
                    log.write(line)
                    target.parse_line(line.rstrip("\n"))
                target.returncode = target.process.wait()
        except OSError as e:
            target.error = f"could not run {target.binary}: {e}"
        target.finished = time.monotonic()
        target.crashes = sorted(f for f in os.listdir(target.dir) if f.startswith(CRASH_PREFIXES))
        target.slow_units = sorted(f for f in os.listdir(target.dir) if f.startswith(SLOW_PREFIX))
        self.confirm_timeouts(target)
        if args.add_seeds and not target.crashed() and not self.interrupted:
            self.merge_seeds(target)
        r = target.result()
        status = "CRASH" if target.crashed() else "ok"
        if target.error:
            status = target.error
        elif target.crashed():
            status = (f"CRASH (exit {target.returncode}, artifacts: "
                      f"{', '.join(target.crashes) or 'none'}; see {target.log_path})")
        with self.lock:
            self.running.remove(target)
            self.done.append(target)
        self.log(f"finish {target.name}  {human_count(r['executions'])} execs in "
                 f"{human_seconds(r['seconds'])}, {r['exec_per_sec']} exec/s, cov {r['cov']}, "
                 f"ft {r['ft']}, {status}"
                 + (f", {len(target.seeds_added)} seeds added" if args.add_seeds else "")
                 + (f" (covering {target.seed_edges['new_edges_seeded']} of "
                    f"{target.seed_edges['new_edges']} new edges)" if target.seed_edges else "")
                 + (f", {target.merge_error}" if target.merge_error else "")
                 + f"  ({self.eta_text()})")

    def confirm_timeouts(self, target):
        """Runs each timeout-* artifact again, alone and not niced: one that finishes within
        -timeout is reported as unconfirmed (a loaded machine starved the fuzzer), not a crash."""
        for name in [f for f in target.crashes if f.startswith("timeout-")]:
            path = os.path.join(target.dir, name)
            try:
                rerun = subprocess.run([target.binary, f"-timeout={self.args.timeout}",
                                        f"-rss_limit_mb={self.args.rss_limit_mb}", path],
                                       capture_output=True, timeout=self.args.timeout * 3 + 30)
                ok = rerun.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if ok:
                target.crashes.remove(name)
                target.unconfirmed_timeouts.append(name)
                self.log(f"{target.name}: {name} ran within {self.args.timeout} s alone: the "
                         f"timeout was the machine's load, not the input (kept, not a crash; "
                         f"the target stopped there, short of its budget)")

    def merge_seeds(self, target):
        """Adds to the repository corpus the few work-corpus inputs that bring new coverage."""
        try:
            target.seeds_added = merge_seeds(target, self.args)
        except MergeError as e:
            target.merge_error = str(e)

    def progress_loop(self, stop):
        while not stop.wait(self.args.progress):
            with self.lock:
                running = list(self.running)
            for t in running:
                execs = t.execs_now()
                self.log(f"       {t.name}  {human_seconds(t.seconds())} elapsed, "
                         f"~{human_count(execs)} execs, {t.exec_per_sec or '?'} exec/s, "
                         f"cov {t.cov}, ft {t.ft}, corp {t.corp_units}  ({self.eta_text()})")

    def run(self):
        def on_term(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, on_term)  # kill stops it like Ctrl-C: stats, then JSON
        stop = threading.Event()
        progress = threading.Thread(target=self.progress_loop, args=(stop,), daemon=True)
        progress.start()
        workers = []
        try:
            while True:
                with self.lock:
                    while self.pending and len(self.running) < self.args.jobs:
                        t = self.pending.pop(0)
                        self.running.append(t)
                        w = threading.Thread(target=self.run_target, args=(t,), daemon=True)
                        workers.append(w)
                        w.start()
                    if not self.pending and not self.running:
                        break
                time.sleep(0.2)
        except KeyboardInterrupt:
            self.interrupted = True
            self.log("interrupted: stopping the running targets (libFuzzer prints its stats)")
            with self.lock:
                self.pending.clear()
                running = list(self.running)
            for t in running:
                t.interrupted = True
                if t.process and t.process.poll() is None:
                    t.process.send_signal(signal.SIGINT)
            for w in workers:
                w.join()
        stop.set()
        for w in workers:
            w.join()


def print_table(results):
    columns = [("target", "target"), ("executions", "execs"), ("exec_per_sec", "exec/s"),
               ("cov", "cov"), ("ft", "ft"), ("corpus_units", "corpus"),
               ("peak_rss_mb", "RSS MB"), ("crashes", "crashes"), ("seconds", "seconds")]
    rows = [[h for _, h in columns]]
    for r in results:
        rows.append(["?" if r[k] is None else str(r[k]) for k, _ in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def merge_only(args, targets):
    """--merge-only: seeds from the work corpora of an earlier campaign in args.out."""
    report_path = os.path.join(args.out, "fuzz_campaign.json")
    report = None
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    failed = False
    for t in targets:
        if not os.path.isdir(t.work):
            print(f"fuzz_campaign: no work corpus {t.work}: run the campaign first (same --out)",
                  file=sys.stderr)
            failed = True
            continue
        if report and t.name in report.get("crashed", []):
            print(f"{t.name}: crashed in the campaign, no seeds added")
            continue
        try:
            added = merge_seeds(t, args)
        except MergeError as e:
            print(f"{t.name}: {e}", file=sys.stderr)
            failed = True
            continue
        e = t.seed_edges
        print(f"{t.name}: {len(added)} seeds added to {t.seeds}: the repository corpus covered "
              f"{e['corpus_edges']} edges, the work corpus {e['new_edges']} more, the seeds "
              f"added {e['new_edges_seeded']} of them")
        for r in (report or {}).get("targets", []):
            if r["target"] == t.name:
                r["seeds_added"] = sorted(set(r.get("seeds_added") or []) | set(added))
                r["seed_edges"] = e
    if report:
        with open(report_path, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 3 if failed else 0


def main():
    parser = argparse.ArgumentParser(
        description="Run every libFuzzer target for a fixed budget and report executions, "
                    "coverage and crashes per target.")
    parser.add_argument("--build", default="build-fuzz",
                        help="the fuzz build folder (make fuzz-build); default build-fuzz")
    parser.add_argument("--seconds", type=int, default=0,
                        help="seconds per target (libFuzzer -max_total_time)")
    parser.add_argument("--runs", type=int, default=0,
                        help="executions per target (libFuzzer -runs); with --seconds, whichever "
                             "comes first")
    parser.add_argument("--seconds-for", action="append", default=[], metavar="NAME=N[,NAME=N]",
                        help="another seconds budget for some targets (e.g. slow ones), "
                             "overriding --seconds")
    parser.add_argument("--targets", default="",
                        help="comma-separated target names (default: every *_fuzz in the build)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="targets run at once (one process each); default 1")
    parser.add_argument("--out", default="out/fuzz-campaign",
                        help="where work corpora, logs, artifacts and the JSON go")
    parser.add_argument("--corpus", default=os.path.join(REPO, "tests", "fuzz", "corpus"),
                        help="the repository corpora, one folder per target")
    parser.add_argument("--add-seeds", action="store_true",
                        help="merge inputs that add coverage into the repository corpora")
    parser.add_argument("--max-seeds", type=int, default=32,
                        help="with --add-seeds, at most this many inputs added per target "
                             "(those that add the most coverage); default 32")
    parser.add_argument("--merge-only", action="store_true",
                        help="no fuzzing: add seeds from the work corpora a campaign left in --out")
    parser.add_argument("--rss-limit-mb", type=int, default=2048)
    parser.add_argument("--timeout", type=int, default=10,
                        help="seconds one input may take before it counts as a hang; default 10")
    parser.add_argument("--nice", type=int, default=0,
                        help="run the fuzzers under nice -n N (e.g. 19 to take only idle CPU)")
    parser.add_argument("--progress", type=float, default=60.0,
                        help="seconds between progress lines; default 60")
    parser.add_argument("--fuzzer-arg", action="append", default=[],
                        help="an extra libFuzzer flag, e.g. --fuzzer-arg=-use_value_profile=1")
    args = parser.parse_args()

    seconds_for = {}
    for item in ",".join(args.seconds_for).split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            fail(f"--seconds-for takes NAME=SECONDS, not {item!r}")
        seconds_for[name.strip()] = int(value)
    if args.merge_only:
        args.add_seeds = True
    elif args.seconds <= 0 and args.runs <= 0 and not seconds_for:
        fail("give a budget: --seconds N (per target), --runs N (executions per target), or both")
    if args.jobs < 1:
        fail("--jobs must be at least 1")
    if not os.path.isdir(args.build):
        fail(f"no fuzz build at {args.build}: run `make fuzz-build` first (or pass --build)")

    if args.targets:
        names = [n.strip() for n in args.targets.split(",") if n.strip()]
    else:
        names = sorted({f for sub in ("tests/fuzz", "tests")
                        if os.path.isdir(os.path.join(args.build, sub))
                        for f in os.listdir(os.path.join(args.build, sub))
                        if f.endswith("_fuzz") and find_binary(args.build, f)})
        if not names:
            fail(f"no fuzz targets (*_fuzz) in {args.build}/tests: run `make fuzz-build` first "
                 "(the build must be configured with -DAGORA_FUZZ=ON)")
    targets = []
    for name in names:
        binary = find_binary(args.build, name)
        if binary is None:
            fail(f"no fuzz target {name} in {args.build}/tests: run `make fuzz-build`, or check "
                 "the name (targets are tests/fuzz/<name>.cc)")
        seeds = os.path.join(args.corpus, name)
        if not os.path.isdir(seeds):
            print(f"fuzz_campaign: note: no corpus {seeds}; {name} starts from nothing",
                  file=sys.stderr)
        target = Target(name, os.path.abspath(binary), os.path.abspath(seeds),
                        os.path.abspath(args.out))
        target.budget_seconds = seconds_for.pop(name, args.seconds)
        if target.budget_seconds <= 0 and args.runs <= 0 and not args.merge_only:
            fail(f"{name} has no budget: give --seconds, --runs or --seconds-for {name}=N")
        targets.append(target)
    if seconds_for:
        fail(f"--seconds-for names targets that are not run: {', '.join(sorted(seconds_for))}")
    if args.merge_only:
        return merge_only(args, targets)
    os.makedirs(args.out, exist_ok=True)

    budget = " and ".join(x for x in (f"{args.seconds} s" if args.seconds else "",
                                     f"{args.runs} runs" if args.runs else "") if x)
    campaign = Campaign(args, targets)
    campaign.log(f"{len(targets)} targets, {budget} each (whichever first), {args.jobs} at a "
                 f"time; out {args.out}")
    started_at = datetime.datetime.now(datetime.timezone.utc)
    campaign.run()

    results = [t.result() for t in targets if t.started is not None]
    print()
    print_table(results)
    crashed = [t.name for t in targets if t.started is not None and t.crashed()]
    report = {
        "started": started_at.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "revision": git_revision(),
        "build": os.path.abspath(args.build),
        "budget": {"seconds": args.seconds or None, "runs": args.runs or None,
                   "seconds_for": {t.name: t.budget_seconds for t in targets
                                   if t.budget_seconds != args.seconds},
                   "rss_limit_mb": args.rss_limit_mb, "timeout": args.timeout},
        "jobs": args.jobs,
        "interrupted": campaign.interrupted,
        "targets": results,
        "crashed": crashed,
    }
    path = os.path.join(args.out, "fuzz_campaign.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"\nwrote {path}")
    if args.add_seeds:
        added = sum(len(r["seeds_added"]) for r in results)
        print(f"{added} seeds added to {args.corpus}")
    merge_failed = [t.name for t in targets if t.merge_error]
    if merge_failed:
        print(f"adding seeds failed for {', '.join(merge_failed)} (see merge.log)", file=sys.stderr)
    if crashed:
        print(f"CRASHES in {', '.join(crashed)}: artifacts and logs are in {args.out}/<target>/",
              file=sys.stderr)
        return 1
    if campaign.interrupted:
        return 130
    return 3 if merge_failed else 0


if __name__ == "__main__":
    sys.exit(main())
