#!/usr/bin/env python3
"""Faults that come one at a time but hit where it hurts: one scenario per invocation.

    faults_test.py AGORA DATA_DIR SCENARIO

- dead_author: a peer SIGKILLed right after it committed costs the step its one payload, not the
  step: the others witness without it in time, the step finalizes with theirs, and no healthy
  author takes a strike.
- checkpointer_handoff: the run's only checkpointer is SIGKILLed mid-run; the role passes to
  another member, and the finished run's final checkpoint is on disk.
- late_peer: a peer still catching up when the last step finalizes still finishes with the
  others' parameters: the members serve it until it has them (or a grace period passes).
- checkpointer_rejoin: a checkpointer that rejoins by fetching the state jumped over
  checkpoint steps; it writes a checkpoint of the state it loaded.
- nat_peer: a peer nobody can dial contributes through the coordinator's relay, unstruck.
- nat_joiner: every member is behind NAT, and a joiner still loads the parameters from them,
  chunk by chunk through the coordinator's relay.

The harness is network_run.Run (real processes on loopback; JSON rows and events); every bound
is derived from the launched config.
"""
import os
import signal
import sys
import time

from network_run import Run, free_port


def wait_for_event(run, i, event, after, timeout):
    """Polls peer i's log until an event of that kind appears beyond the first `after` of them;
    returns it. Polls every 10 ms so that a kill lands right after the event."""
    end = time.time() + timeout
    while time.time() < end:
        events = run.events(i, event)
        if len(events) > after:
            return events[after]
        time.sleep(0.01)
    run.fail(f"peer {i} recorded no new {event!r} event within {timeout} s")


def scenario_dead_author(agora, data):
    peers = 5
    # Each witness gives the dead author 0.25 x witness_seconds and witnesses by 0.65 x it,
    # whatever is still missing (peer_network.h): in time for the step, without the payload.
    run = Run(agora, data, "dead-author", peers=peers, steps=24,
              sets=["network.min_peers=2", "network.witness_seconds=6",
                    "network.heartbeat_timeout_seconds=6"])
    run.start_coordinator()
    for i in range(peers):
        run.start_peer(i)
    run.wait_final(6)
    victim = peers - 1
    trained = wait_for_event(run, victim, "trained", len(run.events(victim, "trained")), 60)
    run.kill_peer(victim)  # right after its commit went out: its payload is committed, unserved
    round_killed = trained["round"]
    run.wait_finished(timeout=180)
    run.check_all_steps_final()
    rows = {r["step"]: r for r in run.steps_final()}
    row = rows[round_killed]
    survivors = [run.short(i) for i in range(peers - 1)]
    # Every survivor trained round_killed and committed: the step holds all their payloads.
    trained_it = [run.short(i) for i in range(peers - 1) if round_killed in run.trained(i)]
    # The victim's payload may count too: on a loaded machine the witnesses can fetch it in the
    # moment between its commit and the kill. What must not happen is a survivor left out.
    allowed = (sorted(trained_it), sorted(trained_it + [run.short(victim)]))
    if sorted(row["authors"]) not in allowed or not trained_it:
        run.fail(f"step {round_killed} (the victim's last round) finalized with authors "
                 f"{row['authors']}, expected the survivors that trained it: {trained_it} "
                 f"(and perhaps the victim, {run.short(victim)}, if its payload was fetched "
                 f"before the kill)")
    struck = [r for r in run.log_rows("strike") if r.get("peer") in survivors]
    if struck:
        run.fail(f"healthy authors were struck: {[r['text'] for r in struck]}")
    empty = [s for s, r in rows.items() if not r["authors"]]
    if empty:
        run.fail(f"steps {empty} finalized with no payload")
    run.check_identical(range(peers - 1), throughout=range(peers - 1))
    print(f"peer {victim} killed right after committing round {round_killed}; step "
          f"{round_killed} final with {len(row['authors'])} payloads; no strike on the survivors")
    run.cleanup()


def checkpoints_written(run, i):
    """Peer i's "checkpoint" events over all its processes: applied_steps -> path."""
    return {e["applied_steps"]: e["path"] for e in run.events(i, "checkpoint")}


def check_final_checkpoint(run, peers):
    """Some peer wrote a checkpoint after all train.steps steps, it is on disk whole, and the
    coordinator recorded it; returns the writer."""
    writers = [i for i in peers if run.steps in checkpoints_written(run, i)]
    if not writers:
        run.fail(f"no peer wrote a checkpoint after the final step {run.steps}")
    for i in writers:
        path = checkpoints_written(run, i)[run.steps]
        for name in ("model.safetensors", "config.json", "agora.json"):
            if not os.path.isfile(os.path.join(path, name)):
                run.fail(f"peer {i}'s final checkpoint {path} has no {name}")
    recorded = [r for r in run.log_rows("checkpoint") if r.get("reason") is None and
                f"after {run.steps} steps" in r["text"]]
    if not recorded:
        run.fail("the coordinator recorded no checkpoint of the final state")
    return writers


def check_released(run, reason="complete"):
    rows = [r for r in run.log_rows("phase") if r.get("reason") in ("complete", "grace_passed")]
    if len(rows) != 1 or rows[0]["reason"] != reason:
        run.fail(f"the coordinator released the members {[r.get('reason') for r in rows]}, "
                 f"expected once, {reason!r}")


def scenario_checkpointer_handoff(agora, data):
    peers = 3
    run = Run(agora, data, "handoff", peers=peers, steps=40,
              sets=["network.min_peers=2", "network.checkpointers=1",
                    "train.checkpoint_interval=5"])
    run.start_coordinator()
    for i in range(peers):
        run.start_peer(i)
    run.wait_until("every peer to join", lambda: all(run.events(i, "joined") for i in range(peers)),
                   60)
    holders = [i for i in range(peers) if run.events(i, "joined")[0]["checkpointer"]]
    if len(holders) != 1:
        run.fail(f"checkpointers at join {holders}, expected network.checkpointers = 1")
    victim = holders[0]
    run.wait_final(12)
    run.kill_peer(victim)
    survivors = [i for i in range(peers) if i != victim]
    run.wait_finished(timeout=180)
    run.check_all_steps_final()
    handoffs = [r for r in run.log_rows("checkpoint") if r.get("reason") == "handoff"]
    heirs = [i for i in survivors if any(r.get("peer") == run.short(i) for r in handoffs)]
    if len(heirs) != 1:
        run.fail(f"the checkpointer role went to {heirs} of the survivors, expected exactly one "
                 f"(handoff rows: {[r['text'] for r in handoffs]})")
    heir = heirs[0]
    took = run.events(heir, "checkpointer")
    if not took or took[-1]["checkpointer"] is not True:
        run.fail(f"peer {heir} was handed the role but never said it holds it")
    writers = check_final_checkpoint(run, survivors)
    if writers != [heir]:
        run.fail(f"the final checkpoint was written by {writers}, expected the heir {heir}")
    # Every multiple of train.checkpoint_interval was checkpointed by someone, or the
    # coordinator reported it missing in a gap row.
    every = int(run.cfg("train.checkpoint_interval"))
    written = set()
    for i in range(peers):
        written |= set(checkpoints_written(run, i))
    gaps = [r for r in run.log_rows("checkpoint") if r.get("reason") == "gap"]
    covered = set()
    for g in gaps:
        covered |= {m for m in range(g["from"] + 1, g["to"]) if m % every == 0}
    unaccounted = [m for m in range(every, run.steps + 1, every) if m not in written | covered]
    if unaccounted:
        run.fail(f"no checkpoint after {unaccounted} steps and no gap reported for them "
                 f"(written {sorted(written)}, gaps {[(g['from'], g['to']) for g in gaps]})")
    check_released(run)
    run.check_identical(survivors, throughout=survivors)
    run.check_finished(survivors)
    print(f"checkpointer {victim} killed; peer {heir} took the role and wrote the final "
          f"checkpoint; checkpoints after {sorted(written)}, gaps reported: "
          f"{[(g['from'], g['to']) for g in gaps]}")
    run.cleanup()


def scenario_late_peer(agora, data):
    peers = 3
    # A long heartbeat timeout and many strikes keep the paused peer a member; short deadlines
    # let the others finish the run while it is paused.
    run = Run(agora, data, "late", peers=peers, steps=20,
              sets=["network.min_peers=2", "network.heartbeat_timeout_seconds=60",
                    "network.max_strikes=20", "network.min_deadline_seconds=2",
                    "network.witness_seconds=2", "network.finish_grace_seconds=60"])
    run.start_coordinator()
    for i in range(peers):
        run.start_peer(i)
    late = peers - 1
    run.wait_final(run.steps - 4)
    run.peers[late].send_signal(signal.SIGSTOP)
    run.wait_until("the run to finish without the paused peer",
                   lambda: any("finished" in r["text"] for r in run.log_rows("phase")), 120)
    time.sleep(5)  # past the 3 s after which members used to exit
    run.peers[late].send_signal(signal.SIGCONT)
    run.wait_finished(timeout=120)
    run.check_all_steps_final()
    run.check_identical(range(peers), throughout=range(peers))
    run.check_finished(range(peers))
    check_released(run)
    lingered = [i for i in range(late) if run.events(i, "lingering")]
    if not lingered:
        run.fail("no member stayed to serve the paused peer")
    print(f"peer {late} paused until after the run finished; members {lingered} stayed and "
          f"served it; it finished with the others' parameters")
    run.cleanup()


def scenario_checkpointer_rejoin(agora, data):
    peers = 3
    run = Run(agora, data, "ckpt-rejoin", peers=peers, steps=40,
              sets=["network.min_peers=2", "network.checkpointers=3",
                    "train.checkpoint_interval=5"])
    run.start_coordinator()
    for i in range(peers):
        run.start_peer(i)
    run.wait_final(8)
    run.kill_peer(0)
    run.wait_until("the killed peer to be dropped", lambda: run.log_rows("drop", run.short(0)), 60)
    run.wait_final(len(run.steps_final()) + 7)  # the run goes past a checkpoint step without it
    run.start_peer(0)
    run.wait_finished(timeout=180)
    lives = run.incarnations(0)
    if len(lives) != 2:
        run.fail(f"peer 0 ran {len(lives)} processes, expected 2")
    loaded = [e for e in lives[1] if e["event"] == "state_loaded"]
    if not loaded or loaded[0]["source"] != "members":
        run.fail(f"the rejoined checkpointer loaded {loaded[:1]}, expected the members' state")
    at = loaded[0]["applied_steps"]
    written = [e["applied_steps"] for e in lives[1] if e["event"] == "checkpoint"]
    if at not in written:
        run.fail(f"the rejoined checkpointer fetched the state after {at} steps but wrote no "
                 f"checkpoint of it (wrote {written})")
    check_final_checkpoint(run, range(peers))
    run.check_identical(range(peers), throughout=[1, 2])
    run.check_finished(range(peers))
    print(f"checkpointer 0 rejoined, fetched the state after {at} steps and checkpointed it")
    run.cleanup()


def scenario_nat_peer(agora, data):
    """A peer nobody can dial (it advertises a port nobody listens on, as a home peer behind NAT
    advertises an address nobody can reach) still contributes through the coordinator's relay,
    and nobody is struck for it."""
    peers = 3
    run = Run(agora, data, "nat", peers=peers, steps=24, sets=["network.min_peers=3"])
    run.start_coordinator(extra=("--http", "off", "--log-format", "json"))
    natted = peers - 1
    for i in range(natted):
        run.start_peer(i)
    dead = free_port()  # nobody listens here: every dial fails
    run.start_peer(natted, extra=("--advertise", f"tcp://127.0.0.1:{dead}"))
    run.wait_finished(timeout=180)
    run.check_all_steps_final()
    marked = [r for r in run.log_rows("join", run.short(natted)) if r.get("reason") == "unreachable"]
    if len(marked) != 1:
        run.fail(f"the coordinator marked the unreachable peer {len(marked)} times, expected once")
    wrongly = [r for i in range(natted) for r in run.log_rows("join", run.short(i))
               if r.get("reason") == "unreachable"]
    if wrongly:
        run.fail(f"reachable peers were marked unreachable: {[r['text'] for r in wrongly]}")
    if run.log_rows("strike"):
        run.fail(f"strikes in a run where everyone could be reached one way or another: "
                 f"{[r['text'] for r in run.log_rows('strike')]}")
    rows = run.steps_final()
    relayed_at = marked[0]["step"]  # finalized steps when it was marked
    # From the round after the one open when it was marked (it learns from RoundStart), every
    # step holds its payload, fetched by the others from the relay.
    first = relayed_at + int(run.cfg("network.overlap")) + 2
    missing = [r["step"] for r in rows if r["step"] >= first and run.short(natted) not in r["authors"]]
    if missing:
        run.fail(f"steps {missing} are final without the relayed peer's payload")
    relayed_rows = [r for r in rows if r["step"] >= first]
    if not relayed_rows or any(r.get("relay_bytes", 0) <= 0 for r in relayed_rows):
        run.fail(f"steps from {first} on relayed no bytes: "
                 f"{[(r['step'], r.get('relay_bytes')) for r in relayed_rows]}")
    uploads = run.events(natted, "relayed")
    if not uploads or uploads[0]["relayed"] is not True:
        run.fail("the unreachable peer never heard that its payloads go through the relay")
    run.check_identical(range(peers), throughout=range(peers))
    run.check_finished(range(peers))
    per_step = sorted(r["relay_bytes"] for r in relayed_rows)
    print(f"peer {natted} unreachable from step {relayed_at}; its payloads reached the others "
          f"through the relay in {len(relayed_rows)} steps, median "
          f"{per_step[len(per_step) // 2]} relay bytes per step, no strikes")
    run.cleanup()


def scenario_nat_joiner(agora, data):
    """Every member sits behind NAT (advertises a port nobody listens on), and a joiner still
    gets the parameters: chunk by chunk through the coordinator's relay from the members nobody
    can dial, each tensor checked against the majority's hash, and it ends identical."""
    peers = 2
    run = Run(agora, data, "nat-joiner", peers=peers + 1, steps=60,
              sets=["network.min_peers=2"])
    run.start_coordinator(extra=("--http", "off", "--log-format", "json"))
    for i in range(peers):
        run.start_peer(i, extra=("--advertise", f"tcp://127.0.0.1:{free_port()}"))
    for i in range(peers):
        run.wait_until(f"peer {i} marked unreachable",
                       lambda i=i: [r for r in run.log_rows("join", run.short(i))
                                    if r.get("reason") == "unreachable"], 60)
    # A state report after the members were marked: the joiner's Welcome names only them.
    first_report = run.hash_interval * 2
    run.wait_final(first_report + 1)
    joiner = peers
    run.start_peer(joiner)
    run.wait_finished(timeout=240)
    run.check_all_steps_final()
    loaded = run.events(joiner, "state_loaded")
    if len(loaded) != 1 or loaded[0]["source"] != "members" or loaded[0]["applied_steps"] == 0:
        run.fail(f"the joiner did not load the parameters from the members: {loaded}")
    summary = {i: run.events(i, "summary")[-1] for i in range(peers + 1)}
    fetched = summary[joiner]["relay_chunks_fetched"]
    served = sum(summary[i]["relay_chunks_served"] for i in range(peers))
    if fetched == 0 or served < fetched:
        run.fail(f"the joiner fetched {fetched} chunks through the relay and the members "
                 f"served {served}: the state did not come through the relay")
    if run.log_rows("strike"):
        run.fail(f"strikes: {[r['text'] for r in run.log_rows('strike')]}")
    run.check_identical(range(peers + 1), throughout=range(peers))
    run.check_finished(range(peers + 1))
    print(f"the joiner loaded the parameters after step {loaded[0]['applied_steps']} in "
          f"{loaded[0]['seconds']:.2f} s through the relay: {fetched} chunks fetched, {served} "
          f"served by {peers} members nobody can dial")
    run.cleanup()


SCENARIOS = {
    "dead_author": scenario_dead_author,
    "checkpointer_handoff": scenario_checkpointer_handoff,
    "late_peer": scenario_late_peer,
    "checkpointer_rejoin": scenario_checkpointer_rejoin,
    "nat_peer": scenario_nat_peer,
    "nat_joiner": scenario_nat_joiner,
}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in SCENARIOS:
        sys.exit(f"usage: faults_test.py AGORA DATA_DIR {{{'|'.join(SCENARIOS)}}}")
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
