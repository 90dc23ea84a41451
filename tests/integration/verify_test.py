#!/usr/bin/env python3
"""Spot checks by recomputation (docs/verification.md) in real runs: one scenario per invocation.

    verify_test.py AGORA DATA_DIR SCENARIO

- lazy_peer: one member of five trains only half of its assigned sequences and commits as if it
  trained them all (AGORA_TEST_CHEAT=half_batch). With verify.rate high it is checked within a
  few rounds: two honest verifiers disagree with it, it fails verify.max_failures checks, is
  dropped (reason failed_verification) and refused when it comes back; no honest member fails a
  check, and the honest members finish every step with one set of parameters.
- lazy_other_data: the same with a member that trains other sequences than its assignment
  (AGORA_TEST_CHEAT=other_data).
- honest_threads: four honest members with different --threads (1, 2, 1, 2: the sums of their
  matrix products come in other orders), every contribution checked (verify.rate = 1): every
  contribution that verify.window more steps followed was checked and passed, every verdict
  agrees, verdicts across thread counts among them, nobody fails or is dropped; prints the
  smallest overlap and the largest momentum error a verifier measured.
- false_accusation: one member of five says DISAGREES in every verdict it gives
  (AGORA_TEST_FALSE_VERDICTS=1). Each accusation goes to a second and a third verifier, who
  overrule it: the check passes, the liar gets a failure, and it is dropped at
  verify.max_failures; no honest author fails a check.

What is asserted is read from what the processes record (network_run.Run): the coordinator's
`--json` rows of kind "verify" (their "check" field: drawn, assigned, verdict, passed,
author_failed, verifier_failed, unresolved) and "drop", and the peers' `--log-format json`
events ("verdict", "trained", "state", "finished"). Every run's ledger of checks is audited
against the rules of src/agora/coord/spot_checks.h (a verdict only from the verifier assigned,
never the author's own; passed after one agreeing verdict or two; failed after two disagreeing;
the losing side of a dispute failed; a drop at verify.max_failures). Every bound is derived from
the launched config (tests/integration/network.toml plus each scenario's --set overrides, read
back through Run.cfg). Peers run with --slowdown SLOWDOWN and deadlines scaled to match (see
SLOWDOWN below: the rates here are 10 to 20 times the default). AGORA_TEST_KEEP=1 keeps the
logs of a passing run.

CMake runs it like faults_test.py: python3 verify_test.py $<TARGET_FILE:agora>
${AGORA_DATA_DIR}/tokens/sp8k SCENARIO. By hand, from the repository root:

    python3 tests/integration/verify_test.py build/apps/agora/agora data/tokens/sp8k lazy_peer
"""
import math
import os
import subprocess
import statistics
import sys
import time

from network_run import CONFIG, Run, load_config

# What the coordinator's verify rows say (the "check" field) and what a verdict can be.
CHECK_KINDS = ("drawn", "assigned", "verdict", "passed", "author_failed", "verifier_failed",
               "unresolved")
ENDS = ("passed", "author_failed", "unresolved")
OUTCOMES = ("agrees", "disagrees", "abstains")
# Fields each kind of row must carry (the contract the C++ prints, state_machine_verify.cc).
FIELDS = {
    "drawn": ("round", "seed", "checks"),
    "assigned": ("round", "author", "verifier", "attempt"),
    "verdict": ("round", "author", "verifier", "outcome"),
    "passed": ("round", "author"),
    "author_failed": ("round", "author", "failures"),
    "verifier_failed": ("round", "author", "verifier", "failures"),
    "unresolved": ("round", "author", "reason"),
}
PEER_VERDICT_FIELDS = ("round", "author", "outcome", "overlap", "worst_overlap", "sign_agreement",
                       "state_error", "seconds", "background", "state_bytes", "whole_state_bytes",
                       "tensors_checked", "tensors_in_state")
# The peer's test hooks (src/agora/peer/verification.h), set only where a scenario says.
HOOKS = ("AGORA_TEST_CHEAT", "AGORA_TEST_FALSE_VERDICTS")
# The longest a scenario's run may take before it counts as stuck (CTest allows 300 s).
RUN_TIMEOUT = 240
# Every peer runs with --slowdown SLOWDOWN: it sleeps (SLOWDOWN - 1) times its training time
# after each round, counted as compute, as slower hardware would take. The scenarios check at
# verify.rate 0.5 and 1, 10 and 20 times the default, and a peer verifies on a thread at nice 5
# (nice 10 when this was measured), behind training: with five peers training on two cores and rounds of a third of a second, the
# verifiers fell behind by more than verify.window rounds and the coordinator ignored their
# verdicts. The sleep leaves them the idle time a run at the default rate has.
SLOWDOWN = 3


class VerifyRun(Run):
    """A Run whose peers may each have their own --threads and environment (the test hooks
    AGORA_TEST_CHEAT and AGORA_TEST_FALSE_VERDICTS are read by the peer process)."""

    def __init__(self, agora, data, name, peers, steps, sets=()):
        # Slower hardware needs longer deadlines: network.min_deadline_seconds times SLOWDOWN
        # (the first round, before the coordinator has measured anyone, has only that: a cold
        # first step of 1.4 s here became 4.1 s, over network.toml's 4 s, and struck everyone).
        base = float(load_config(CONFIG, sets)["network"]["min_deadline_seconds"])
        sets = [*sets, f"network.min_deadline_seconds={base * SLOWDOWN}"]
        super().__init__(agora, data, name, peers=peers, steps=steps, sets=sets)
        self.threads = {}  # peer -> its --threads
        self.started_at = time.time()

    def start_peer(self, i, key=None, extra=(), env=None, threads=1):
        # Run.start_peer passes --threads 1, and CLI11 refuses an option given twice: so the same
        # command line here, with the peer's own thread count.
        key = key or os.path.join(self.dir, f"peer-{i}.key")
        args = [self.agora, "peer", "--coordinator", f"tcp://127.0.0.1:{self.port}",
                "--coordinator-key", self.coordinator_key, "--key", key, "--data", self.data,
                "--listen", "tcp://127.0.0.1:*", "--threads", str(threads), "--log-format",
                "json", "--checkpoint-dir", os.path.join(self.dir, f"ckpt-{i}"),
                "--slowdown", str(SLOWDOWN), *extra]
        # No test hook leaks from this process's environment into an honest peer.
        child = {k: v for k, v in os.environ.items() if k not in HOOKS}
        child.update(env or {})
        log = open(os.path.join(self.dir, f"peer-{i}.log"), "a")
        self.peers[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=child)
        self.threads[i] = threads
        return self.peers[i]

    def elapsed(self):
        return time.time() - self.started_at

    def cleanup(self):
        """Run.cleanup, unless AGORA_TEST_KEEP is set: then the logs stay."""
        if os.environ.get("AGORA_TEST_KEEP"):
            self.stop()
            print(f"logs kept in {self.dir}")
        else:
            super().cleanup()


class Check:
    """One spot check of one contribution (round, author) as the coordinator's rows tell it."""

    def __init__(self, round_, author):
        self.round, self.author = round_, author
        self.assigned = []         # (row index, verifier, attempt)
        self.verdicts = []         # (row index, verifier, outcome, reason)
        self.ends = []             # (row index, kind, row): passed / author_failed / unresolved
        self.verifier_failed = []  # (row index, verifier, failures)

    def end(self):
        return self.ends[0][1] if self.ends else None

    def counted(self):
        """The verdicts that decide (agrees / disagrees), in order."""
        return [(v, o) for _, v, o, _ in self.verdicts if o != "abstains"]

    def describe(self, run):
        return (f"round {self.round}, author peer {self.author} ({run.short(self.author)}): "
                f"assigned {[(v, a) for _, v, a in self.assigned]}, verdicts "
                f"{[(v, o) for _, v, o, _ in self.verdicts]}, end {self.end()}, verifier_failed "
                f"{[v for _, v, _ in self.verifier_failed]}")


class Ledger:
    """The coordinator's verify and drop rows of a finished run, parsed and audited."""

    def __init__(self, run):
        self.run = run
        self.cfg = run.verify_config()
        self.rows = run.rows()
        self.checks = {}     # (round, author) -> Check
        self.drawn = {}      # round -> row
        self.failures = {}   # peer -> [(row index, kind, failures, round)]
        self.drops = {}      # peer -> (row index, row) of its failed_verification drop
        self.other_drops = []
        for n, r in enumerate(self.rows):
            if r.get("event") != "log":
                continue
            if r.get("kind") == "drop":
                who = self.peer_short(r)
                if r.get("reason") == "failed_verification":
                    if who in self.drops:
                        run.fail(f"peer {who} was dropped for failed_verification twice: "
                                 f"{self.drops[who][1]} and {r}")
                    self.drops[who] = (n, r)
                else:
                    self.other_drops.append((who, r))
            if r.get("kind") == "verify":
                self.add(n, r)

    def peer_short(self, r):
        short = r.get("peer")
        for i in range(len(self.run.peer_keys)):
            if self.run.short(i) == short:
                return i
        self.run.fail(f"a drop row names no peer of this run: {r}")

    def add(self, n, r):
        run = self.run
        kind = r.get("check")
        if kind == "ignored":  # logged as kind "ignored", but tolerate it here
            return
        if kind not in CHECK_KINDS:
            run.fail(f"a verify row has check {kind!r}, not one of {CHECK_KINDS}: {r}")
        missing = [f for f in FIELDS[kind] if f not in r]
        if missing:
            run.fail(f"a verify row of check {kind!r} lacks {missing}: {r}")
        if kind == "drawn":
            if r["round"] in self.drawn:
                run.fail(f"round {r['round']} was drawn twice: {self.drawn[r['round']]} and {r}")
            if not isinstance(r["checks"], int) or r["checks"] < 0:
                run.fail(f"a draw with checks {r['checks']!r}: {r}")
            self.drawn[r["round"]] = r
            return
        author = run.peer_of(r["author"], r)
        key = (r["round"], author)
        check = self.checks.get(key)
        if kind in ("assigned", "unresolved") and check is None:
            # A check whose candidates had all left ends unresolved without an assignment.
            check = self.checks[key] = Check(r["round"], author)
        if kind == "assigned":
            verifier = run.peer_of(r["verifier"], r)
            if verifier == author:
                run.fail(f"peer {author} was assigned to verify its own contribution: {r}")
            if check.end() is not None:
                run.fail(f"a verifier was assigned after the check ended: {r}\n"
                         f"{check.describe(run)}")
            check.assigned.append((n, verifier, r["attempt"]))
            return
        if check is None:
            run.fail(f"a verify row of check {kind!r} about a check never assigned: {r}")
        if kind == "verdict":
            verifier = run.peer_of(r["verifier"], r)
            if r["outcome"] not in OUTCOMES:
                run.fail(f"a verdict with outcome {r['outcome']!r}: {r}")
            if not check.assigned or check.assigned[-1][1] != verifier:
                run.fail(f"a verdict from peer {verifier}, who is not the verifier the check was "
                         f"last assigned to: {r}\n{check.describe(run)}")
            if any(v == verifier for _, v, _, _ in check.verdicts):
                run.fail(f"peer {verifier} gave two verdicts in one check: {r}\n"
                         f"{check.describe(run)}")
            if check.end() is not None:
                run.fail(f"a verdict counted after the check ended: {r}\n{check.describe(run)}")
            check.verdicts.append((n, verifier, r["outcome"], r.get("reason", "")))
        elif kind in ENDS:
            if check.end() is not None:
                run.fail(f"a check ended twice ({check.end()}, then {kind}): {r}\n"
                         f"{check.describe(run)}")
            check.ends.append((n, kind, r))
            if kind == "author_failed":
                self.failed(author, n, kind, r)
        elif kind == "verifier_failed":
            verifier = run.peer_of(r["verifier"], r)
            check.verifier_failed.append((n, verifier, r["failures"]))
            self.failed(verifier, n, kind, r)

    def failed(self, who, n, kind, r):
        if not isinstance(r["failures"], int) or r["failures"] < 1:
            self.run.fail(f"a failure row with failures {r['failures']!r}: {r}")
        self.failures.setdefault(who, []).append((n, kind, r["failures"], r["round"]))

    # ------------------------------------------------------------------------- the audit

    def audit(self):
        """The rules every run obeys, whoever cheats (src/agora/coord/spot_checks.h)."""
        run = self.run
        for check in self.checks.values():
            counted = check.counted()
            agree = sum(1 for _, o in counted if o == "agrees")
            disagree = len(counted) - agree
            end = check.end()
            if len(counted) > 3:
                run.fail(f"a check counted {len(counted)} verdicts, at most 3 decide one:\n"
                         f"{check.describe(run)}")
            if end == "passed" and not (agree >= 2 or (agree == 1 and disagree == 0)):
                run.fail(f"a check passed without one agreeing verdict or two:\n"
                         f"{check.describe(run)}")
            if end == "author_failed" and disagree < 2:
                run.fail(f"an author failed a check without two disagreeing verdicts:\n"
                         f"{check.describe(run)}")
            if end in ("passed", "author_failed"):
                losing = "disagrees" if end == "passed" else "agrees"
                losers = sorted(v for v, o in counted if o == losing)
                failed = sorted(v for _, v, _ in check.verifier_failed)
                if losers != failed:
                    run.fail(f"the check ended {end}: verifiers {losers} were on the losing "
                             f"side, but verifier_failed names {failed}:\n{check.describe(run)}")
            elif check.verifier_failed:
                run.fail(f"verifier_failed in a check that did not end passed or failed:\n"
                         f"{check.describe(run)}")
            if end is None and (agree >= 2 or disagree >= 2 or (agree == 1 and disagree == 0)):
                run.fail(f"a check with decisive verdicts never ended:\n{check.describe(run)}")
            # Whoever verifies round s is another member, one active in round s: it trained
            # it, or was handed nothing then (a member that takes the whole batch is checked by
            # those left without data). Each is asked once.
            asked = [v for _, v, _ in check.assigned]
            if check.author in asked or len(set(asked)) != len(asked):
                run.fail(f"a check was asked of its author or twice of one verifier:\n"
                         f"{check.describe(run)}")
        # Every draw was followed by that many checks (the rows of a round's draw come together).
        for round_, r in self.drawn.items():
            authors = {a for (s, a) in self.checks if s == round_}
            if len(authors) != r["checks"]:
                run.fail(f"round {round_} drew {r['checks']} checks but {len(authors)} authors "
                         f"were checked ({sorted(authors)})")
        if any(s not in self.drawn for s, _ in self.checks):
            run.fail(f"checks of rounds never drawn: "
                     f"{sorted({s for s, _ in self.checks if s not in self.drawn})}")
        # Failures: one count per member over both kinds, a drop exactly where it reaches
        # verify.max_failures, and no drop without it.
        limit = self.cfg["max_failures"]
        for who, rows in self.failures.items():
            counts = [f for _, _, f, _ in rows]
            if counts != list(range(1, len(counts) + 1)):
                run.fail(f"peer {who}'s failure counts went {counts}, expected 1, 2, ...")
            reached = [n for n, _, f, _ in rows if f == limit]
            if reached and who not in self.drops:
                run.fail(f"peer {who} reached verify.max_failures = {limit} failures but was "
                         f"not dropped for failed_verification: {rows}")
            if reached and self.drops[who][0] < reached[0]:
                run.fail(f"peer {who} was dropped before its failure reached {limit}")
        for who, (n, r) in self.drops.items():
            if not any(f >= limit and m < n for m, _, f, _ in self.failures.get(who, [])):
                run.fail(f"peer {who} was dropped for failed_verification without "
                         f"verify.max_failures = {limit} failures: {r}")
            # A dropped member is asked to verify nothing after its drop, and what it still
            # answers is refused, not counted.
            late = [c for c in self.checks.values() for m, v, _ in c.assigned if v == who and m > n]
            late += [c for c in self.checks.values() for m, v, _, _ in c.verdicts
                     if v == who and m > n]
            if late:
                run.fail(f"dropped peer {who} was still assigned or counted in checks:\n"
                         f"{late[0].describe(run)}")

    # ------------------------------------------------------------------------- questions

    def verdicts(self, by=None, about=None):
        """(check, verifier, outcome) of the verdict rows, by one verifier / about one author."""
        return [(c, v, o) for c in self.checks.values() for _, v, o, _ in c.verdicts
                if (by is None or v == by) and (about is None or c.author == about)]

    def ended(self, kind, author=None):
        return [c for c in self.checks.values() if c.end() == kind and
                (author is None or c.author == author)]

    def failures_of(self, who, kind=None):
        return [x for x in self.failures.get(who, []) if kind is None or x[1] == kind]


def peer_verdicts(run, i):
    """Peer i's "verdict" events, each with the field the contract names."""
    out = run.events(i, "verdict")
    for e in out:
        missing = [f for f in PEER_VERDICT_FIELDS if f not in e]
        if missing:
            run.fail(f"peer {i}'s verdict event lacks {missing}: {e}")
    return out


def check_peer_verdicts_logged(run, ledger, verifiers):
    """Each verdict row from an honest verifier matches a "verdict" event in that verifier's
    log (same round, author and outcome): the peer measured what the coordinator recorded."""
    for i in verifiers:
        logged = {(e["round"], run.peer_of(e["author"], e), e["outcome"])
                  for e in peer_verdicts(run, i)}
        for c, v, o in ledger.verdicts(by=i):
            if (c.round, c.author, o) not in logged:
                run.fail(f"the coordinator recorded peer {i}'s verdict {o!r} on round {c.round} "
                         f"of peer {c.author}, but peer {i} logged no such verdict event")


def figures(events):
    """The extremes of what verifiers measured (None where no verdict measured it); an
    abstention measured nothing."""
    events = [e for e in events if e["outcome"] != "abstains"]

    def values(key):
        return [e[key] for e in events if isinstance(e.get(key), (int, float)) and
                math.isfinite(e[key])]

    def lo(key):
        v = values(key)
        return min(v) if v else None

    def hi(key):
        v = values(key)
        return max(v) if v else None

    return {"verdicts": len(events), "min_overlap": lo("overlap"),
            "min_worst_overlap": lo("worst_overlap"), "min_sign_agreement": lo("sign_agreement"),
            "max_state_error": hi("state_error"), "min_state_error": lo("state_error"),
            "max_seconds": hi("seconds")}


def fmt_figures(f):
    return ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in f.items())


def below(n, p, k):
    """P(Binomial(n, p) < k)."""
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k))


def rounds_to_draw(rate, times, risk):
    """The fewest rounds in which a contribution checked with probability `rate` each round is
    checked `times` times or more, except with probability at most `risk`."""
    n = times
    while below(n, rate, times) > risk:
        n += 1
    return n


def round_shares(run):
    """Round -> {short key: the sequences it was handed}, from the coordinator's "round N opened:
    ... (key=count ...)" rows (members handed nothing included)."""
    out = {}
    for r in run.rows():
        text = r.get("text", "")
        if r.get("kind") == "round" and " opened: " in text and "(" in text:
            shares = {}
            for part in text[text.index("(") + 1:text.index(")")].split():
                key, _, count = part.partition("=")
                if count.isdigit():
                    shares[key] = int(count)
            out[r["round"]] = shares
    return out


def shares_of(run, i):
    """Round -> the sequences peer i was handed."""
    short = run.short(i)
    return {round_: shares[short] for round_, shares in round_shares(run).items() if short in shares}


def check_honest_unaccused(run, ledger, honest):
    """No honest member failed a check, as author or as verifier, nor was dropped for it."""
    for i in honest:
        rows = ledger.failures_of(i)
        if rows:
            run.fail(f"honest peer {i} got failures {rows} (row, kind, count, round)")
        if i in ledger.drops:
            run.fail(f"honest peer {i} was dropped for failed_verification: {ledger.drops[i][1]}")
        struck = run.log_rows("strike", run.short(i)) + run.log_rows("drop", run.short(i))
        if struck:
            run.fail(f"honest peer {i} was struck or dropped: {[r['text'] for r in struck[:3]]}")


def check_honest_checks_passed(run, ledger, honest):
    """Every check of an honest author that was decided passed; returns the unresolved ones."""
    for i in honest:
        failed = ledger.ended("author_failed", author=i)
        if failed:
            run.fail(f"honest author {i} failed a check:\n{failed[0].describe(run)}")
    return [c for c in ledger.checks.values() if c.author in honest and c.end() == "unresolved"]


def check_dropped(run, ledger, who, what):
    """`who` was dropped for failed_verification within the run (before its last step was
    final); returns the drop row."""
    if who not in ledger.drops:
        run.fail(f"the {what} (peer {who}) was not dropped for failed_verification; its failures "
                 f"(row, kind, count, round): {ledger.failures_of(who)}; its verdicts "
                 f"{[(c.round, c.author, o) for c, _, o in ledger.verdicts(by=who)]}; drops "
                 f"for other reasons: {ledger.other_drops}")
    n, row = ledger.drops[who]
    if not row["step"] < run.steps:
        run.fail(f"the {what} was dropped only after the run's last step was final: {row}")
    return row


def wait_dropped(run, who, what):
    """Waits until `who` is dropped for failed_verification, or the run ends without it (then
    fails with what the ledger says about it)."""
    def dropped():
        return any(r.get("reason") == "failed_verification"
                   for r in run.log_rows("drop", run.short(who)))
    run.wait_until(f"the {what} (peer {who}) to be dropped",
                   lambda: dropped() or run.coordinator.poll() is not None, RUN_TIMEOUT)
    if not dropped():
        check_dropped(run, Ledger(run), who, what)


def wait_exit(run, i, what, timeout=60):
    """Peer i's process exits, with an error (it was refused); returns the code."""
    run.wait_until(f"the {what} (peer {i}) to exit", lambda: run.peers[i].poll() is not None,
                   timeout)
    code = run.peers[i].returncode
    if code == 0:
        run.fail(f"the {what} (peer {i}) exited 0 after it was dropped; expected an error (the "
                 f"coordinator refused it)")
    return code


def finish(run):
    """The coordinator exits 0 and so does every peer still running; a peer already stopped
    (dropped, refused) is not waited for. The checks of who exited how come after the ledger's,
    which say why."""
    run.wait_until("the coordinator to finish", lambda: run.coordinator.poll() is not None,
                   RUN_TIMEOUT)
    if run.coordinator.returncode != 0:
        run.fail(f"the coordinator exited with {run.coordinator.returncode}")
    codes = {}
    for i, p in run.peers.items():
        try:
            codes[i] = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.fail(f"peer {i} did not exit after the run finished")
    return codes


def check_exits(run, codes, failing):
    """Peers in `failing` exited with an error (refused), the others 0."""
    for i, code in codes.items():
        if (code != 0) != (i in failing):
            last = run.peer_log(i).strip().splitlines()[-1:]
            run.fail(f"peer {i} exited with {code}, expected "
                     f"{'an error' if i in failing else '0'}: {last[0] if last else ''}")


# ----------------------------------------------------------------------------- scenarios


def scenario_lazy(agora, data, cheat):
    honest_count = 4
    cheater = honest_count  # peer 4
    rate, max_failures, window = 0.5, 2, 8
    # Each round the cheater's contribution is drawn with probability verify.rate, and every
    # draw of it costs it a failure (two honest verifiers disagree). The fewest rounds after
    # which it was drawn max_failures times but for a chance of 1e-6, then verify.window rounds
    # for the last of those checks to be decided, and a few for its rejoin to be refused while
    # the run still goes on.
    risk = 1e-6
    needed = rounds_to_draw(rate, max_failures, risk)
    steps = needed + window + 6
    run = VerifyRun(agora, data, f"verify-{cheat}", peers=honest_count + 1, steps=steps,
                    sets=[f"network.min_peers={honest_count}", "network.warmup_seconds=3.0",
                          f"verify.rate={rate}", "verify.seconds=15",
                          f"verify.max_failures={max_failures}", f"verify.window={window}"])
    cfg = run.verify_config()
    print(f"verify.rate {cfg['rate']}, verify.max_failures {cfg['max_failures']}: "
          f"P(the cheater drawn fewer than {cfg['max_failures']} times in its first {needed} "
          f"rounds) = {below(needed, cfg['rate'], cfg['max_failures']):.2e}; {run.steps} steps")
    honest = list(range(honest_count))
    env = {"AGORA_TEST_CHEAT": cheat}
    run.start_coordinator()
    # The cheater first: min_peers is the honest count (the run must go on once it is dropped),
    # and with it already joined the warm-up starts with all five.
    run.start_peer(cheater, env=env)
    for i in honest:
        run.start_peer(i)
    run.wait_until("every peer to join",
                   lambda: all(run.events(i, "joined") for i in range(honest_count + 1)), 60)
    wait_dropped(run, cheater, "cheater")
    dropped_at = run.elapsed()
    # Told it was dropped, it stops; it comes back with the same key and is refused for the
    # rest of the run.
    code = wait_exit(run, cheater, "dropped cheater")
    seen = len(run.rows())
    if run.coordinator.poll() is not None:
        run.fail("the run ended before the dropped cheater could try to rejoin; more steps")
    run.start_peer(cheater, env=env)
    run.wait_until("the returning cheater to be refused",
                   lambda: any(r.get("kind") == "rejection" and r.get("peer") == run.short(cheater)
                               for r in run.rows()[seen:]), 60)
    wait_exit(run, cheater, "refused cheater")
    codes = finish(run)

    ledger = Ledger(run)
    ledger.audit()
    run.check_all_steps_final()
    drop = check_dropped(run, ledger, cheater, "cheater")
    check_exits(run, codes, failing=[cheater])
    failed = ledger.failures_of(cheater, "author_failed")
    if len(failed) < cfg["max_failures"]:
        run.fail(f"the cheater was dropped after {len(failed)} failed checks as an author, "
                 f"expected verify.max_failures = {cfg['max_failures']}: "
                 f"{ledger.failures_of(cheater)}")
    # Every honest verifier that judged the cheater's work found it wrong, except where the
    # cheat changed nothing: half_batch trains max(1, share / 2) sequences, all of a share of 1.
    did_honest_work = {r for r, n in shares_of(run, cheater).items()
                       if cheat == "half_batch" and n == 1}
    covered = [(c.round, v) for c, v, o in ledger.verdicts(about=cheater)
               if v in honest and o == "agrees" and c.round not in did_honest_work]
    if covered:
        run.fail(f"honest verifiers agreed with the cheater's contributions (round, verifier): "
                 f"{covered}")
    check_honest_unaccused(run, ledger, honest)
    unresolved = check_honest_checks_passed(run, ledger, honest)
    passed = ledger.ended("passed")
    honest_passed = [c for c in passed if c.author in honest]
    if not honest_passed:
        run.fail("no honest contribution was checked and passed: the run tested nothing")
    # A check of a round where the cheat changed nothing passes, rightly (seen in CI: a share of 1
    # in round 1).
    cheats_passed = [c for c in ledger.ended("passed", author=cheater)
                     if c.round not in did_honest_work]
    if cheats_passed:
        run.fail(f"a check of the cheater passed:\n{cheats_passed[0].describe(run)}")
    # Its payloads stop being final once the rounds it could still commit to are over.
    after = drop["step"] + int(run.cfg("network.overlap")) + 2
    late = [r["step"] for r in run.steps_final()
            if r["step"] >= after and run.short(cheater) in r["authors"]]
    if late:
        run.fail(f"the dropped cheater's payloads were final at steps {late}")
    # The draw took each contribution with p = min(1, rate x max(1, share / mean share)), the mean
    # over the round's members (coord/spot_checks.h): more than verify.rate of them when shares
    # are unequal (a member handed nothing counts). Expected count within 6 standard deviations.
    handed = round_shares(run)
    contributions, expected, variance = 0, 0.0, 0.0
    for r in run.steps_final():
        shares = handed.get(r["step"], {})
        committed = [shares.get(a, 0) for a in r["authors"]]
        total, members = sum(committed), max(len(shares), len(committed))
        for share in committed:
            p = cfg["rate"] if total == 0 else min(
                1.0, cfg["rate"] * max(1.0, share * members / total))
            expected += p
            variance += p * (1 - p)
        contributions += len(committed)
    drawn = sum(r["checks"] for r in ledger.drawn.values())
    spread = 6 * math.sqrt(variance) + 2
    if abs(drawn - expected) > spread:
        run.fail(f"{drawn} checks drawn from {contributions} final contributions, expected "
                 f"{expected:.0f} +- {spread:.0f} at verify.rate {cfg['rate']}")
    check_peer_verdicts_logged(run, ledger, honest)
    run.check_identical(honest, throughout=honest)
    run.check_finished(honest)
    about_cheater = [e for i in honest for e in peer_verdicts(run, i)
                     if run.peer_of(e["author"], e) == cheater]
    about_honest = [e for i in honest for e in peer_verdicts(run, i)
                    if run.peer_of(e["author"], e) in honest]
    print(f"{cheat}: cheater drawn in rounds "
          f"{sorted({c.round for c in ledger.checks.values() if c.author == cheater})}, failed "
          f"checks of rounds {[r for _, _, _, r in failed]}, dropped when {drop['step']} steps "
          f"were final ({dropped_at:.0f} s in, exit {code}) and refused on its return")
    print(f"{drawn} checks drawn of {contributions} contributions; {len(honest_passed)} honest "
          f"checks passed, {len(unresolved)} unresolved "
          f"{sorted({c.ends[0][2]['reason'] for c in unresolved})}")
    print(f"verifiers on the cheater: {fmt_figures(figures(about_cheater))}")
    print(f"verifiers on honest authors: {fmt_figures(figures(about_honest))}")
    print(f"{cheat} passed in {run.elapsed():.0f} s")
    run.cleanup()


def scenario_lazy_peer(agora, data):
    scenario_lazy(agora, data, "half_batch")


def scenario_lazy_other_data(agora, data):
    scenario_lazy(agora, data, "other_data")


def scenario_honest_threads(agora, data):
    threads = [1, 2, 1, 2]
    peers = len(threads)
    window = 8
    fraction = 0.25
    run = VerifyRun(agora, data, "verify-threads", peers=peers, steps=20,
                    sets=[f"network.min_peers={peers}", "verify.rate=1.0", "verify.seconds=15",
                          "verify.max_failures=2", f"verify.window={window}",
                          f"verify.state_fraction={fraction}"])
    cfg = run.verify_config()
    run.start_coordinator()
    for i, t in enumerate(threads):
        run.start_peer(i, threads=t)
    codes = finish(run)
    ledger = Ledger(run)
    ledger.audit()
    run.check_all_steps_final()
    honest = list(range(peers))
    check_exits(run, codes, failing=[])
    check_honest_unaccused(run, ledger, honest)
    if ledger.other_drops or ledger.drops:
        run.fail(f"members were dropped in an honest run: {ledger.other_drops} {ledger.drops}")
    wrong = [(c.round, c.author, v, o) for c, v, o in ledger.verdicts() if o != "agrees"]
    if wrong:
        run.fail(f"verdicts other than agrees in an honest run (round, author, verifier, "
                 f"outcome): {wrong}")
    # verify.rate = 1: every contribution of every round is drawn (a round with two or more
    # committers), and a check of round s is decided within verify.window rounds or ends
    # unresolved. So every contribution final at a step that verify.window more steps followed
    # was checked and passed with one agreeing verdict.
    settled = [r for r in run.steps_final() if r["step"] + cfg["window"] < run.steps]
    for r in settled:
        for short in r["authors"]:
            author = next(i for i in honest if run.short(i) == short)
            check = ledger.checks.get((r["step"], author))
            if check is None or check.end() != "passed":
                run.fail(f"verify.rate = {cfg['rate']}, but peer {author}'s contribution to step "
                         f"{r['step']} was "
                         f"{'never checked' if check is None else check.describe(run)}")
    needed = sum(len(r["authors"]) for r in settled)
    verdicts = ledger.verdicts()
    if len(verdicts) < needed:
        run.fail(f"{len(verdicts)} verdicts, expected at least {needed} (every contribution to "
                 f"steps 0..{settled[-1]['step'] if settled else -1})")
    check_peer_verdicts_logged(run, ledger, honest)
    events = [e for i in honest for e in peer_verdicts(run, i)]
    bad = [e for e in events if e["outcome"] != "agrees"]
    if bad:
        run.fail(f"honest verifiers logged verdicts other than agrees: {bad[:3]}")
    # Verdicts across thread counts are the point: count them.
    pairs = {}
    for c, v, _ in verdicts:
        pair = (run.threads[c.author], run.threads[v])
        pairs[pair] = pairs.get(pair, 0) + 1
    across = sum(n for (a, v), n in pairs.items() if a != v)
    if across < peers:
        run.fail(f"only {across} verdicts by a verifier with another thread count than the "
                 f"author's (by (author, verifier) threads: {pairs}); expected at least {peers}")
    # verify.rate = 1 doubles the work, and the split makes room for it: the training threads,
    # waiting for their next round, recompute the checks (the worker only takes one left
    # waiting two rounds).
    # Each check compared the sample of the momentum verify.state_fraction names, not all of
    # it: at least that share of the bytes, and not every tensor.
    for e in events:
        if e["state_bytes"] < fraction * e["whole_state_bytes"] or e["tensors_checked"] < 1:
            run.fail(f"a check fetched {e['state_bytes']} of {e['whole_state_bytes']} state bytes "
                     f"({e['tensors_checked']} tensors), under verify.state_fraction = "
                     f"{fraction}: {e}")
    if not any(e["tensors_checked"] < e["tensors_in_state"] for e in events):
        run.fail(f"every check compared every tensor of the momentum at verify.state_fraction = "
                 f"{fraction}: {events[:2]}")
    on_training = [e for e in events if not e["background"]]
    if not on_training:
        run.fail(f"none of {len(events)} checks was recomputed on a training thread while it "
                 f"waited (verdict events' background field)")
    unresolved = [c for c in ledger.checks.values() if c.end() == "unresolved"]
    run.check_identical(honest, throughout=honest)
    run.check_finished(honest)
    print(f"threads {threads}: {len(verdicts)} verdicts, all agree, {len(on_training)} of "
          f"{len(events)} recomputed on a training thread; by (author, verifier) "
          f"threads {dict(sorted(pairs.items()))}; {len(unresolved)} checks unresolved "
          f"(rounds {sorted(c.round for c in unresolved)})")
    print(f"verifiers measured: {fmt_figures(figures(events))}; state fetched per check "
          f"{statistics.median(e['state_bytes'] for e in events) / 1e6:.2f} MB median of "
          f"{events[0]['whole_state_bytes'] / 1e6:.2f} MB whole")
    print(f"honest_threads passed in {run.elapsed():.0f} s")
    run.cleanup()


def scenario_false_accusation(agora, data):
    honest_count = 4
    liar = honest_count  # peer 4
    max_failures = 2
    run = VerifyRun(agora, data, "verify-liar", peers=honest_count + 1, steps=30,
                    sets=[f"network.min_peers={honest_count}", "network.warmup_seconds=3.0",
                          "verify.rate=1.0", "verify.seconds=15",
                          f"verify.max_failures={max_failures}", "verify.window=8"])
    cfg = run.verify_config()
    honest = list(range(honest_count))
    run.start_coordinator()
    run.start_peer(liar, env={"AGORA_TEST_FALSE_VERDICTS": "1"})
    for i in honest:
        run.start_peer(i)
    wait_dropped(run, liar, "lying verifier")
    wait_exit(run, liar, "dropped liar")
    codes = finish(run)
    ledger = Ledger(run)
    ledger.audit()
    run.check_all_steps_final()
    drop = check_dropped(run, ledger, liar, "lying verifier")
    check_exits(run, codes, failing=[liar])
    accusations = [c for c, v, o in ledger.verdicts(by=liar) if o == "disagrees"]
    if len(accusations) < cfg["max_failures"]:
        run.fail(f"the liar made {len(accusations)} accusations, fewer than verify.max_failures "
                 f"= {cfg['max_failures']}: the test proves nothing")
    agreed = [(c.round, c.author) for c, v, o in ledger.verdicts(by=liar) if o == "agrees"]
    if agreed:
        run.fail(f"AGORA_TEST_FALSE_VERDICTS=1, yet the liar's verdicts agreed on "
                 f"(round, author) {agreed}")
    # Each accusation of an honest author was overruled: the check passed (two others agreed)
    # and the liar took a failure for it, or (a check still open when the run ended, or whose
    # author left) it ended unresolved.
    overruled = []
    for c in accusations:
        if c.author not in honest:
            continue
        if c.end() == "passed":
            if liar not in [v for _, v, _ in c.verifier_failed]:
                run.fail(f"the liar's accusation was overruled but it took no failure:\n"
                         f"{c.describe(run)}")
            overruled.append(c)
        elif c.end() != "unresolved" and c.end() is not None:
            run.fail(f"the liar's accusation of honest peer {c.author} ended {c.end()}:\n"
                     f"{c.describe(run)}")
    if len(overruled) < cfg["max_failures"]:
        run.fail(f"{len(overruled)} of the liar's accusations were overruled, expected at least "
                 f"verify.max_failures = {cfg['max_failures']}")
    failed = ledger.failures_of(liar, "verifier_failed")
    if len(failed) < cfg["max_failures"]:
        run.fail(f"the liar was dropped with {len(failed)} verifier failures: "
                 f"{ledger.failures_of(liar)}")
    check_honest_unaccused(run, ledger, honest)
    unresolved = check_honest_checks_passed(run, ledger, honest)
    check_peer_verdicts_logged(run, ledger, honest)
    run.check_identical(honest, throughout=honest)
    run.check_finished(honest)
    events = [e for i in honest for e in peer_verdicts(run, i)]
    print(f"the liar accused {len(accusations)} contributions (rounds "
          f"{sorted(c.round for c in accusations)}), {len(overruled)} overruled by two honest "
          f"verifiers; dropped when {drop['step']} steps were final; {len(unresolved)} honest "
          f"checks unresolved {sorted({c.ends[0][2]['reason'] for c in unresolved})}; no "
          f"honest failure")
    print(f"honest verifiers measured: {fmt_figures(figures(events))}")
    print(f"false_accusation passed in {run.elapsed():.0f} s")
    run.cleanup()


SCENARIOS = {
    "lazy_peer": scenario_lazy_peer,
    "lazy_other_data": scenario_lazy_other_data,
    "honest_threads": scenario_honest_threads,
    "false_accusation": scenario_false_accusation,
}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in SCENARIOS:
        sys.exit(f"usage: verify_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}}")
    try:
        SCENARIOS[sys.argv[3]](*sys.argv[1:3])
    except Exception:
        import traceback
        traceback.print_exc()
        for r in Run.started:
            r.stop()
        if Run.started and os.path.isdir(Run.started[-1].dir):
            Run.started[-1].fail("the test crashed (above)")
        sys.exit(1)
