"""The adversary's side of the harness (adversary_test.py, network_test.py's tamper): a Run with
adversaries, each an `agora_adversary` process (tests/adversary/) holding a key on the run's
allowlist, and the checks every attack ends with: the honest peers bit-identical and still
training, the attacker struck or refused.
"""
import json
import os
import subprocess

from network_run import Run, parse_json_lines

# The coordinator's event kinds that mean it noticed a member misbehave (docs/protocol.md
# section 14): a strike, a drop, a refused or rejected message, an ignored one, and messages
# dropped above the per-member rate (a `throttled` line of its own log, not an event row).
NOTICED = ("strike", "drop", "rejection", "ignored", "throttled")


class AdversaryRun(Run):
    """A Run of `honest` peers (indices 0..honest-1) and `adversaries` attackers (indices
    honest..honest+adversaries-1, keys on the allowlist like everyone's).

    network.min_peers is the honest count: a run must go on once its attackers are dropped, and
    would pause for good if it needed them. start_honest() starts the honest peers and waits for
    them to join; adversaries started then join during the warm-up (network.warmup_seconds = 3
    here), so the run's first round is theirs too."""

    def __init__(self, agora, adversary, data, name, honest, adversaries, steps, sets=()):
        self.attackers = {}  # index -> Popen; first, so that stop() works whatever fails next
        self.honest = list(range(honest))
        self.adversary = adversary
        sets = [f"network.min_peers={honest}", "network.warmup_seconds=3.0", *sets]
        super().__init__(agora, data, name, peers=honest + adversaries, steps=steps, sets=sets)

    def start_adversary(self, i, attack, *args):
        """Adversary i (its key is peer i's) attacking with `attack` and its flags. The other
        adversaries' keys are its allies: it never forges from their payloads."""
        allies = [a for j in range(len(self.honest), len(self.peer_keys)) if j != i
                  for a in ("--ally", self.short(j))]
        cmd = [self.adversary, "--coordinator", f"tcp://127.0.0.1:{self.port}",
               "--coordinator-key", self.coordinator_key,
               "--key", os.path.join(self.dir, f"peer-{i}.key"), "--data", self.data,
               "--attack", attack, "--seed", str(i), *allies, *map(str, args)]
        out = open(os.path.join(self.dir, f"adversary-{i}.jsonl"), "a")
        err = open(os.path.join(self.dir, f"adversary-{i}.log"), "a")
        self.attackers[i] = subprocess.Popen(cmd, stdout=out, stderr=err)
        return self.attackers[i]

    def start_honest(self, extra=()):
        for i in self.honest:
            self.start_peer(i, extra=extra)
        self.wait_until("the honest peers to join",
                        lambda: all(self.events(i, "joined") for i in self.honest), 60)

    def actions(self, i, event=None):
        """Adversary i's JSON lines (what it did), optionally of one event."""
        return [j for j in parse_json_lines(os.path.join(self.dir, f"adversary-{i}.jsonl"))
                if event is None or j.get("event") == event]

    def endpoint_of(self, i):
        """The endpoint honest peer i serves on, from its first log line ("serving on ...")."""
        for e in parse_json_lines(os.path.join(self.dir, f"peer-{i}.log")):
            msg = e.get("msg", "")
            if msg.startswith("serving on "):
                return msg.split()[2].rstrip(";")
        return None

    def wait_endpoint(self, i, timeout=30):
        self.wait_until(f"peer {i} to serve", lambda: self.endpoint_of(i) is not None, timeout)
        return self.endpoint_of(i)

    def wait_until(self, what, predicate, timeout):
        """Run.wait_until, failing at once when an honest peer exits with an error (an attack
        that worked), with the error it printed."""
        def honest_alive():
            for i in self.honest:
                p = self.peers.get(i)
                if p is not None and p.poll() not in (None, 0):
                    last = self.peer_log(i).strip().splitlines()[-1:]
                    self.fail(f"honest peer {i} exited with {p.returncode} while waiting for "
                              f"{what}: {last[0] if last else ''}")
            return predicate()
        super().wait_until(what, honest_alive, timeout)

    # ------------------------------------------------------------------------- the checks

    def check_attacked(self, i, event="commit", at_least=1):
        """Adversary i did what it was started for: at least `at_least` `event` lines."""
        done = self.actions(i, event)
        if len(done) < at_least:
            self.fail(f"adversary {i} recorded {len(done)} '{event}' actions, expected at least "
                      f"{at_least}: the attack did not happen, so the test proves nothing")
        return done

    def start_coordinator(self, extra=("--http", "off")):
        """Run.start_coordinator, its own log (coordinator.log) as JSON lines too."""
        super().start_coordinator(extra=(*extra, "--log-format", "json"))

    def coordinator_log_events(self):
        """The coordinator's own log lines (coordinator.log, --log-format json) as dicts, with
        "kind" set to their "event"; lines that are not JSON are skipped."""
        rows = []
        path = os.path.join(self.dir, "coordinator.log")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict) and "event" in row:
                        rows.append({**row, "kind": row["event"]})
        return rows

    def check_noticed(self, i, kinds=NOTICED):
        """The coordinator struck, dropped, rejected, ignored or throttled adversary i: a row of
        one of `kinds` about it (`peer`), or a witness's rejection of its payload (`author`).
        Whether a flooder is also struck depends on timing (flooding, it may miss deadlines or
        not); that its messages were dropped above the rate does not."""
        short = self.short(i)
        rows = [r for r in self.log_rows() + self.coordinator_log_events() if
                r.get("kind") in kinds and (r.get("peer") == short or r.get("author") == short)]
        if not rows:
            self.fail(f"the coordinator recorded no {'/'.join(kinds)} about adversary {i} "
                      f"({short})")
        return rows

    def check_honest_unharmed(self):
        """No honest peer was struck or dropped."""
        for i in self.honest:
            hit = self.log_rows("strike", self.short(i)) + self.log_rows("drop", self.short(i))
            if hit:
                self.fail(f"honest peer {i} was struck or dropped: {hit[:3]}")

    def attacks(self, i):
        """Adversary i's actions that were attacks: not its start, join, layout check or
        copies of honest payloads, nor an honest witness."""
        out = []
        for a in self.actions(i):
            if a["event"] in ("start", "joined", "layout", "summary", "finished", "refused",
                              "resync", "timeout"):
                continue
            if a["event"] == "commit" and a["what"].startswith("copy"):
                continue
            if a["event"] == "witness" and not a["lying"]:
                continue
            out.append(a)
        return out

    def check_trained_after(self, i_attacker, peers=None):
        """The run went on past the attack: every honest peer (of `peers`) trained a round
        after the steps final when adversary i_attacker first attacked, and trained on to the
        last round, train.steps - 1, or to one past its last attack."""
        attacks = self.attacks(i_attacker)
        if not attacks:
            self.fail(f"adversary {i_attacker} never attacked")
        first = attacks[0]["finalized"]
        last = max(a.get("round", a["finalized"]) for a in attacks)
        for i in (self.honest if peers is None else peers):
            rounds = sorted(self.trained(i))
            if not any(r > first for r in rounds) or \
                    rounds[-1] < min(last + 1, self.steps - 1):
                self.fail(f"honest peer {i} trained rounds {rounds}: not on past adversary "
                          f"{i_attacker}'s attacks (from {first} final steps to round {last})")

    def check_honest_loss_falls(self, peers=None):
        """The honest peers' own training losses fall (what attackers claim is not used),
        compared over the first and last quarter of the run: a bounded attacker still kicks the
        weights now and then (every honest loss jumps by up to a nat for a step or two), and one
        jump in a window of 3 steps hid a real fall (adversary_values in CI: 9.00 -> 8.46
        against a bound of 0.75)."""
        by_round = {}
        for i in (self.honest if peers is None else peers):
            for e in self.events(i, "trained"):
                by_round.setdefault(e["round"], []).append(e["loss"])
        losses = [sum(v) / len(v) for _, v in sorted(by_round.items())]
        self.check_loss_falls(losses, window=max(3, len(losses) // 4))

    def finish(self, peers=None):
        """The run finished; the honest peers (`peers`) exited 0 with one final hash."""
        self.wait_finished()
        self.check_finished(self.honest if peers is None else peers)

    def cleanup(self):
        """Run.cleanup, unless AGORA_TEST_KEEP is set: then the logs stay (the campaign keeps
        them to read what each attack did)."""
        if os.environ.get("AGORA_TEST_KEEP"):
            self.stop()
            print(f"logs kept in {self.dir}")
        else:
            super().cleanup()

    def stop(self):
        for p in self.attackers.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        super().stop()
