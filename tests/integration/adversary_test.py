#!/usr/bin/env python3
"""Attacks on a run by a member: real `agora coordinator` and `agora peer` processes on loopback
plus `agora_adversary` processes (tests/adversary/), one scenario per invocation.

    adversary_test.py AGORA AGORA_ADVERSARY DATA_DIR SCENARIO [--long]

Each scenario groups a few attacks into one run (tests/integration/network.toml, small and
short) and ends with what docs/security.md promises: the honest peers bit-identical (one state
hash after every applied step and at the end), still training after the attack, and the attacker
struck or refused (the coordinator's `--json` rows of kind strike/drop/rejection/ignored naming
its key). --long runs the same scenarios with more steps and for longer (the campaign:
scripts/adversary_campaign.sh). What the processes record is read as data: the coordinator's
rows, the peers' `--log-format json` events, the adversaries' JSON lines (adversary_run.py).
"""
import os
import sys

from adversary_run import NOTICED, AdversaryRun
from network_run import Run

LONG = "--long" in sys.argv


def steps(short, long):
    return long if LONG else short


def scenario_steps(agora, adversary, data):
    """Payloads for another step: one adversary commits well-formed payloads whose step field is
    the previous round's (wrong-step), another re-commits honest peers' payloads of earlier steps
    under its own signature (replay). Witnesses must refuse both: nothing of theirs becomes
    final, they are struck, and the honest peers, which would fail applying such a step ("is for
    step"), train to the end identical."""
    run = AdversaryRun(agora, adversary, data, "adv-steps", honest=3, adversaries=2,
                       steps=steps(14, 60))
    run.start_coordinator()
    run.start_honest()
    # From round 2 on: rounds 0 and 1 commit copies, so that the replay has honest payloads of
    # earlier steps to replay and each attacker is a member in good standing when it attacks.
    run.start_adversary(3, "wrong-step", "--from-round", 2)
    run.start_adversary(4, "replay", "--from-round", 2)
    run.finish()
    for i in (3, 4):
        attacks = [a for a in run.check_attacked(i) if a["round"] >= 2]
        wrong = [a for a in attacks if a["payload_step"] == a["round"]]
        if not attacks or wrong:
            run.fail(f"adversary {i}'s commits from round 2 on {attacks[:3]} are not for another "
                     f"step")
        run.check_noticed(i)
        final = [r["step"] for r in run.steps_final()
                 if run.short(i) in r["authors"] and r["step"] >= 2]
        if final:
            run.fail(f"adversary {i}'s payloads for another step became final at steps {final}")
        run.check_trained_after(i)
    run.check_honest_unharmed()
    run.check_identical(run.honest, throughout=run.honest)
    # The metric that counts it: each honest witness refused their payloads
    # (agora_peer_payloads_rejected_total, which the summary reports as payloads_rejected).
    for i in run.honest:
        summary = run.events(i, "summary")
        if not summary or summary[-1]["payloads_rejected"] < 1:
            run.fail(f"honest peer {i} counted no rejected payload: {summary[-1:]}")
    print(f"wrong-step and replay refused; 3 honest peers identical through {run.steps} steps")
    run.cleanup()


def scenario_values(agora, adversary, data):
    """Valid but extreme payloads (demo.one_bit = false, so values travel as floats): one member
    of four sends an honest payload's positions with values near FLT_MAX of the opposite sign,
    which without a bound decides the sign of every coefficient it selects, against the honest
    direction (the issue's run: the honest loss rose from 9.0 to 11.8). Bounded, it counts at most
    demo.max_norm_ratio honest members (docs/security.md), fewer than the three honest ones: the
    honest peers stay identical and finite, their own training loss falls, and they train to the
    end. (Sign flips at an honest size, and two attackers, are measured by bench/poisoning.)"""
    # 60 steps: the attacker slows the descent (bounded, it still counts as much as an honest
    # member, against three), so the fall needs more steps than a clean run's to clear the
    # noise bound.
    run = AdversaryRun(agora, adversary, data, "adv-values", honest=3, adversaries=1,
                       steps=steps(60, 120), sets=["demo.one_bit=false"])
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(3, "scale", "--factor=-3e38", "--from-round", 1)
    run.finish()
    run.check_attacked(3, at_least=run.steps // 2)
    run.check_trained_after(3)
    run.check_identical(run.honest, throughout=run.honest)
    run.check_honest_unharmed()
    run.check_honest_loss_falls()
    print("FLT_MAX contributions of the opposite sign did not stop the honest loss from falling")
    run.cleanup()


def scenario_unavailable(agora, adversary, data):
    """Payloads nobody can fetch: one adversary commits and never answers for its payload
    (withhold); another joins advertising honest peer 0's endpoint as its own (steal-endpoint),
    so whoever dials it for the adversary meets peer 0's key. Every honest witness must still
    report in time: no honest member is struck or dropped, the run does not pause, and the
    attackers, whose payloads never reach anyone, are struck."""
    run = AdversaryRun(agora, adversary, data, "adv-unavailable", honest=3, adversaries=2,
                       steps=steps(14, 60))
    run.start_coordinator()
    run.start_honest()
    victim = run.wait_endpoint(0)
    # --silent: neither witnesses either, so the honest payloads have only honest holders (as
    # witnesses, the attackers would make up a quorum for them and hide the harm).
    run.start_adversary(3, "withhold", "--silent")
    run.start_adversary(4, "steal-endpoint", "--advertise", victim, "--silent")
    run.wait_until("the withholding adversary to be asked for its payload",
                   lambda: run.actions(3, "withheld"), 60)
    run.finish()
    run.check_honest_unharmed()
    run.check_attacked(3)
    # The thief commits, or is refused at its Join (an endpoint another member holds).
    if not run.actions(4, "refused"):
        run.check_attacked(4)
    for i in (3, 4):
        run.check_noticed(i, kinds=("strike", "drop", "rejection"))
        final = [r["step"] for r in run.steps_final() if run.short(i) in r["authors"]]
        if final:
            run.fail(f"adversary {i}'s unreachable payloads became final at steps {final}")
    run.check_identical(run.honest, throughout=run.honest)
    # Every finalized step after the attackers joined holds the honest peers' payloads.
    honest = {run.short(i) for i in run.honest}
    thin = [r["step"] for r in run.steps_final() if r["step"] >= 2 and
            not honest <= set(r["authors"]) and r["sequences"]]
    if thin:
        run.fail(f"steps {thin} lack an honest peer's payload: honest authors were refused")
    print("withheld and stolen-endpoint payloads struck; no honest peer struck or dropped")
    run.cleanup()


def scenario_coordinator(agora, adversary, data):
    """The coordinator under a member's pressure: one adversary sends heartbeats as fast as it
    can for a while; another reports forged states (applied_steps 2^64-2 with its own hashes).
    Deadlines keep firing during the flood (no gap between finalized steps longer than a round's
    deadline plus the witness window, with room), and an honest peer that joins after both is
    handed the honest members' state, catches up and ends identical."""
    # The run must outlast the flood and the joiner's arrival after it: a quiet 2-core machine
    # trains the tiny model's rounds in about 0.45 s, so 60 steps take 27 s or more against
    # 3 + 5 s of flood (a loaded one is slower at both).
    flood = steps(5, 60)
    run = AdversaryRun(agora, adversary, data, "adv-coordinator", honest=4, adversaries=2,
                       steps=steps(60, 100), sets=["network.min_peers=3"])
    run.honest = [0, 1, 2]  # peer 3 joins later and is checked on its own
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(4, "flood", "--flood-kind", "heartbeat", "--rate", 0,
                        "--flood-seconds", flood, "--flood-after", 3)
    run.start_adversary(5, "forged-state", "--state-mode", "huge")
    run.wait_until("the flood to end", lambda: run.actions(4, "flood"), 120)
    if run.actions(4, "flood")[0].get("cut_short"):
        run.fail(f"the run ended before the flood of {flood} s did: the joiner has nothing to "
                 f"join; give the run more steps than {run.steps}")
    # The joiner must find a state to fetch: a step made final by the honest members (on a
    # loaded machine the flood can end before the first one).
    run.wait_until("a finalized step to join at",
                   lambda: any(r["step"] >= 1 for r in run.steps_final()), 120)
    run.start_peer(3)
    run.honest = [0, 1, 2, 3]
    run.finish()
    sent = run.check_attacked(4, "flood")[0]
    run.check_attacked(5, "state_report")
    # A round closes by its deadline (network.min_deadline_seconds here: the tiny model trains
    # a share in well under deadline_factor times less) and finalizes within witness_seconds
    # after; twice their sum leaves room for a loaded machine and still catches the stall.
    bound = 2 * (float(run.cfg("network.min_deadline_seconds")) +
                 float(run.cfg("network.witness_seconds")))
    times = [r["time"] for r in run.steps_final()]
    gaps = [b - a for a, b in zip(times, times[1:])]
    if max(gaps, default=0) > bound:
        run.fail(f"finalized steps were {max(gaps):.1f} s apart during a flood of "
                 f"{sent['sent']} heartbeats ({sent['per_second']:.0f}/s); bound {bound:.1f} s")
    for i in (4, 5):
        run.check_noticed(i)
    # The state it trained from (the last it loaded; a joiner whose state moved on joins again,
    # logged as `rejoin`), against the newest Welcome's finalized steps.
    loaded = run.events(3, "state_loaded")
    joined = run.events(3, "joined") + run.events(3, "rejoin")
    finalized = max((j["finalized_steps"] for j in joined if "finalized_steps" in j), default=0)
    if not loaded or loaded[-1]["source"] != "members" or \
            not 0 < loaded[-1]["applied_steps"] <= finalized:
        run.fail(f"the joiner loaded {loaded[-1:]} after joining {joined}: expected an "
                 f"honest state after 1..finalized steps, from the members")
    run.check_honest_unharmed()
    run.check_identical(run.honest, throughout=[0, 1, 2])
    print(f"{sent['sent']} heartbeats ({sent['per_second']:.0f}/s) did not stall the clock "
          f"(largest gap {max(gaps):.1f} s); a forged state did not reach the joiner")
    run.cleanup()


def scenario_witnesses(agora, adversary, data):
    """A lying witness in a run of four: the adversary rejects every payload of the three honest
    members and holds none. Its word is one witness of three for each payload: no honest member
    is struck or dropped, their payloads become final, and they train to the end. (Runs of two or
    three cannot outvote a liar: docs/protocol.md, "Known limits".)"""
    run = AdversaryRun(agora, adversary, data, "adv-witnesses", honest=3, adversaries=1,
                       steps=steps(10, 40))
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(3, "lying-witness")
    run.finish()
    lies = run.check_attacked(3, "witness")
    if not any(w["lying"] and w["rejected"] for w in lies):
        run.fail("the adversary never rejected a payload it witnessed")
    run.check_honest_unharmed()
    final = run.steps_final()
    for i in range(3):
        honest = run.short(i)
        mine = [r["step"] for r in final if honest in r["authors"]]
        if len(mine) < run.steps // 2:
            run.fail(f"honest member {i}'s payloads became final only at steps {mine}")
    run.check_trained_after(3)
    print(f"the lying witness rejected {sum(len(w['rejected']) for w in lies)} payloads; no "
          f"honest member was struck")
    run.cleanup()


# Attacks a witness can recognise from the bytes (wrong step, undecodable): the attacker's
# payloads never become final and it is struck. The rest are valid payloads or protocol abuse;
# the campaign asserts only that the honest peers come through.
DETECTABLE = {"wrong-step", "replay", "garbage", "withhold", "steal-endpoint", "forged-state",
              "flood", "oversized"}


# The adversary's line that shows each attack happened (tests/adversary/adversary.cc).
EVIDENCE = {"flood": "flood", "oversized": "oversized", "forged-state": "state_report",
            "lying-witness": "witness", "silent-witness": "witness_withheld",
            "withhold": "withheld"}


def scenario_single(agora, adversary, data, attack_args):
    """One adversary, any attack (the campaign's building block): 3 honest peers and
    `agora_adversary ATTACK_ARGS`; the honest peers come through identical and training, and a
    detectable attacker is noticed."""
    attack = attack_args[attack_args.index("--attack") + 1]
    sets = []
    if attack in ("scale", "noise", "zero", "sign-flip") and "--one-bit" not in attack_args:
        sets.append("demo.one_bit=false")
    run = AdversaryRun(agora, adversary, data, f"adv-{attack}", honest=3, adversaries=1,
                       steps=steps(16, 60), sets=sets)
    run.start_coordinator()
    run.start_honest()
    args = [a for a in attack_args if a != "--one-bit"]
    if attack == "steal-endpoint":
        args += ["--advertise", run.wait_endpoint(0)]
    at = args.index("--attack")
    run.start_adversary(3, attack, *(args[:at] + args[at + 2:]))
    run.finish()
    run.check_attacked(3, EVIDENCE.get(attack, "commit"))
    run.check_honest_unharmed()
    if attack == "oversized":
        # A frame over a limit is dropped before anyone reads it, and counted
        # (agora_network_messages_dropped_total) with a line on the coordinator's stderr; a
        # peer's server closes the connection of a frame over its limit (ZMQ_MAXMSGSIZE).
        if "coordinator" in attack_args and \
                "dropped a malformed message" not in open(os.path.join(run.dir,
                                                                        "coordinator.log")).read():
            run.fail("the coordinator did not drop and count the oversized messages")
    elif attack in DETECTABLE:
        # A forged state at the right count is a minority: the coordinator resyncs its author.
        run.check_noticed(3, NOTICED + (("resync",) if attack == "forged-state" else ()))
    run.check_trained_after(3)
    run.check_identical(run.honest, throughout=run.honest)
    print(f"{' '.join(attack_args)}: 3 honest peers identical and unharmed")
    run.cleanup()


def scenario_verifiers(agora, adversary, data):
    """Spot checks under a member's pressure (docs/verification.md), at verify.rate 0.5: one
    adversary sends verdicts nobody asked it for as fast as it can, each accusing an honest
    author of the step before; another asks the honest peers for strategy states nobody
    committed to. A verdict counts only from the verifier a check was assigned to, so no honest
    member fails a check or is struck or dropped; the coordinator records the ignored verdicts
    (capped per member and round); the honest members finish every step identical."""
    flood = steps(8, 60)
    run = AdversaryRun(agora, adversary, data, "adv-verifiers", honest=3, adversaries=2,
                       steps=steps(24, 100),
                       sets=["network.min_peers=3", "verify.rate=0.5", "verify.window=64"])
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(3, "flood", "--flood-kind", "verdict", "--rate", 0,
                        "--flood-seconds", flood, "--flood-after", 3)
    run.start_adversary(4, "flood", "--flood-kind", "get-strategy", "--rate", 0,
                        "--flood-seconds", flood, "--flood-after", 3)
    run.wait_until("the floods to end",
                   lambda: run.actions(3, "flood") and run.actions(4, "flood"), 120)
    run.finish()
    verdicts = run.check_attacked(3, "flood")[0]
    run.check_attacked(4, "flood")
    run.check_noticed(3, kinds=("ignored",))
    honest = {run.peer_keys[i] for i in run.honest}
    failed = [r for r in run.log_rows("verify") if r.get("check") in
              ("author_failed", "verifier_failed") and
              (r.get("author") in honest and r["check"] == "author_failed" or
               r.get("verifier") in honest and r["check"] == "verifier_failed")]
    if failed:
        run.fail(f"honest members failed spot checks under the flood: {failed[:3]}")
    run.check_honest_unharmed()
    run.check_identical(run.honest, throughout=run.honest)
    print(f"{verdicts['sent']} unasked verdicts ({verdicts['per_second']:.0f}/s) and a flood of "
          f"strategy requests changed nothing: no honest member failed a check")
    run.cleanup()


def scenario_hog(agora, adversary, data):
    """Taking the batch without the work (docs/verification.md section 4, "Throughput claims"):
    an adversary commits a copy the moment each round opens and says it computed it in no time.
    Shares follow when commits arrive, so it is handed most of the batch; a contribution is
    drawn in proportion to its share over the round's active members, and members handed nothing
    verify too, so its lazy contributions are checked (it serves none of the states it committed
    to) and it is dropped for failed_verification before the run ends; no honest member fails a
    check; the honest members finish every step identical."""
    from verify_test import Ledger, check_dropped, check_honest_unaccused
    rate, max_failures = 0.2, 2
    run = AdversaryRun(agora, adversary, data, "adv-hog", honest=3, adversaries=1,
                       steps=steps(30, 100),
                       sets=["network.min_peers=3", f"verify.rate={rate}", "verify.seconds=15",
                             f"verify.max_failures={max_failures}", "verify.window=16"])
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(3, "copy", "--claim-throughput", 1e9)
    run.finish()
    commits = run.check_attacked(3)
    # It took more than an equal share: the attack happened.
    members = len(run.honest) + 1
    took = max(c["sequences"] for c in commits)
    if took * members <= run.batch_size:
        run.fail(f"the adversary was never handed more than an equal share ({took} of "
                 f"{run.batch_size}): shares did not follow its early commits")
    ledger = Ledger(run)
    ledger.audit()
    check_dropped(run, ledger, 3, "adversary taking the batch")
    check_honest_unaccused(run, ledger, run.honest)
    # How often it was drawn is reported, not asserted: it is dropped within a few rounds, too
    # few to tell its rate from verify.rate with confidence (the unit tests measure the draw).
    key = run.peer_keys[3]
    drawn = {c.round for c in ledger.checks.values() if c.author == 3}
    rounds = {c["round"] for c in commits}
    run.check_honest_unharmed()
    run.check_identical(run.honest, throughout=run.honest)
    print(f"the adversary took up to {took} of {run.batch_size} sequences a round, was checked "
          f"in {len(drawn)} of its {len(rounds)} rounds (verify.rate {rate}) and dropped "
          f"({key[:8]})")
    run.cleanup()


def scenario_slow(agora, adversary, data):
    """A volunteer slower than the deadline (docs/protocol.md section 6, "Throughput"): an
    adversary that commits a copy share / 1 s after each round opens, as a machine of 1 sequence
    a second would, beside 3 honest peers. Its first share (the median, 6 of 24: its speed is
    unknown) takes it 6 s against a 4 s deadline, so it misses its first rounds. Its late
    commits measure it, each takes back its round's strike, and network.max_strikes (2) never
    drops it: its shares shrink to what it can do. Before late commits counted, it was never
    measured and was dropped for strikes in its second round. The honest peers finish identical
    and unharmed."""
    run = AdversaryRun(agora, adversary, data, "adv-slow", honest=3, adversaries=1,
                       steps=steps(14, 40))
    run.start_coordinator()
    run.start_honest()
    run.start_adversary(3, "copy", "--claim-throughput", 1)
    run.finish()
    key = run.short(3)
    commits = run.check_attacked(3)
    deadline = float(run.cfg("network.min_deadline_seconds"))
    first = min(commits, key=lambda c: c["round"])
    if first["sequences"] <= deadline:
        run.fail(f"its first share was {first['sequences']} sequences, {first['sequences']} s at "
                 f"1 a second: within the {deadline} s deadline, so this proves nothing")
    measured = [r for r in run.log_rows("ignored", key) if "sequences_per_second" in r]
    if not measured:
        run.fail(f"none of its late commits measured it: {run.log_rows('ignored', key)[:3]}")
    # (When the run has finished it stops heartbeating and is dropped for silence: not a strike.)
    struck_out = [r for r in run.log_rows("drop", key) if r.get("reason") == "strikes"]
    if struck_out:
        run.fail(f"the slow member was dropped for strikes: {struck_out}")
    strikes = run.log_rows("strike", key)
    if len(strikes) > len(measured) + 1:
        run.fail(f"{len(strikes)} strikes but only {len(measured)} of them taken back by late "
                 f"commits that measured it")
    later = [c["sequences"] for c in commits if c["round"] > measured[0]["round"] + 1]
    if later and max(later) >= first["sequences"]:
        run.fail(f"its shares after it was measured ({later}) are not below its first "
                 f"({first['sequences']})")
    run.check_all_steps_final()
    run.check_honest_unharmed()
    run.check_identical(run.honest, throughout=run.honest)
    print(f"the slow member ({key}) missed {len(strikes)} deadline(s), was measured at "
          f"{[round(r['sequences_per_second'], 2) for r in measured]} sequences/s by its late "
          f"commits, kept its membership, and was handed {later} afterwards")
    run.cleanup()


SCENARIOS = {
    "steps": scenario_steps,
    "values": scenario_values,
    "unavailable": scenario_unavailable,
    "coordinator": scenario_coordinator,
    "witnesses": scenario_witnesses,
    "verifiers": scenario_verifiers,
    "hog": scenario_hog,
    "slow": scenario_slow,
}

if __name__ == "__main__":
    # adversary_test.py AGORA ADVERSARY DATA SCENARIO [--long]
    # adversary_test.py AGORA ADVERSARY DATA single [--long] -- --attack NAME [FLAGS...]
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = [a for a in (argv[:argv.index("--")] if "--" in argv else argv) if a != "--long"]
    names = [*SCENARIOS, "single"]
    if len(args) != 4 or args[3] not in names or (args[3] == "single") != bool(extra):
        sys.exit(f"usage: adversary_test.py AGORA AGORA_ADVERSARY DATA_DIR "
                 f"{{{'|'.join(SCENARIOS)}}} [--long]\n"
                 f"       adversary_test.py AGORA AGORA_ADVERSARY DATA_DIR single [--long] -- "
                 f"--attack NAME [FLAGS...]")
    try:
        if args[3] == "single":
            scenario_single(args[0], args[1], args[2], extra)
        else:
            SCENARIOS[args[3]](args[0], args[1], args[2])
    except Exception:  # a record without a field the test reads, ...: a failure, processes stopped
        import traceback
        traceback.print_exc()
        for run in Run.started:
            run.stop()
        if Run.started and os.path.isdir(Run.started[-1].dir):
            Run.started[-1].fail("the test crashed (above)")
        sys.exit(1)
