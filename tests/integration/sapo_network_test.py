#!/usr/bin/env python3
"""SAPO between machines (docs/rl.md section 5): four `agora rl sapo-node` processes sharing the
groups they sample as text, two of them hostile.

    sapo_network_test.py AGORA OUT

A small base model is made (as rl_network_test.py makes it, on one-digit problems and for
BASE_STEPS steps, so that its samples are sometimes right: groups whose rewards differ, the only
ones SAPO shares), then five nodes run on loopback,
each naming the other four as peers: two honest, one publishing tokens outside the vocabulary
(--behave garbage), one publishing held-out problems with their correct answers (--behave
held-out), one publishing each of its valid groups eight times to fill its peers' pools (--behave
flood; issue 38, finding 11). Checked, from the structured output only:
  - every node runs every round (sapo_node_round rows 1..ROUNDS) and exits 0;
  - each honest node received exactly OWN groups per round from the other honest node and from
    the flooding node (the rest of its reply capped, sapo_node_capped), and refused every reply of
    the other hostile ones whole, by the reason that names what was wrong (bad_token, held_out),
    once per round;
  - SAPO's draw: each round an honest node uses min(SHARED, the informative groups it received)
    shared groups, never one whose rewards are all alike, and every group it used is in its
    GRPO update (OWN + used groups); over the run the honest nodes used shared groups;
  - the node's rewards are its own: cumulative_reward is the sum of its rounds' rewards.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_network_test import events, make_base, run  # noqa: E402

ROUNDS, OWN, SHARED, GROUP = 3, 2, 2, 4
MAX_DIGITS, BASE_STEPS = 1, 150
NODES = {"honest0": "honest", "honest1": "honest", "garbage": "garbage", "held_out": "held-out",
         "flood": "flood"}
COPIES = 8  # the flooding node sends each of its groups this many times (sapo_node.cc)


def main():
    agora, out = sys.argv[1], sys.argv[2]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    base = make_base(agora, out, max_digits=MAX_DIGITS, steps=BASE_STEPS)
    keys, ports = {}, {}
    for i, name in enumerate(NODES):
        keys[name] = run([agora, "keygen", "--out", f"{out}/{name}.key"]).strip().split()[-1]
        ports[name] = 7860 + i
    procs = {}
    try:
        for name, behave in NODES.items():
            peers = []
            for other in NODES:
                if other != name:
                    peers += ["--peer", f"tcp://127.0.0.1:{ports[other]}@{keys[other]}"]
            procs[name] = subprocess.Popen(
                [agora, "rl", "sapo-node", "--checkpoint", base, "--key", f"{out}/{name}.key",
                 "--listen", f"tcp://127.0.0.1:{ports[name]}", *peers,
                 "--rounds", str(ROUNDS), "--own", str(OWN), "--shared", str(SHARED),
                 "--group", str(GROUP), "--max-new-tokens", "8", "--eval-problems", "8",
                 "--max-digits", str(MAX_DIGITS),
                 "--share-wait", "60", "--linger", "10", "--behave", behave,
                 "--out", f"{out}/{name}"],
                stdout=open(f"{out}/{name}.out", "w"), stderr=subprocess.STDOUT)
        for name, p in procs.items():
            assert p.wait(timeout=300) == 0, f"{name} failed: see {out}/{name}.out"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()

    used = {}
    for name in NODES:
        log = events(f"{out}/{name}/sapo.jsonl")
        rounds = [e for e in log if e["event"] == "sapo_node_round"]
        assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), (name, rounds)
        summary = next(e for e in log if e["event"] == "sapo_node_summary")
        assert abs(summary["cumulative_reward"] - sum(r["reward"] for r in rounds)) < 1e-9
        for r in rounds:
            assert r["shared_informative"] <= r["shared_received"], (name, r)
            assert r["shared_used"] == min(SHARED, r["shared_informative"]), (name, r)
            assert r["update_groups"] == OWN + r["shared_used"], (name, r)
        if NODES[name] != "honest":
            continue
        used[name] = sum(r["shared_used"] for r in rounds)
        assert summary["shared_received"] == 2 * ROUNDS * OWN, (name, summary)
        assert summary["capped"] == ROUNDS * OWN * (COPIES - 1), (name, summary)
        capped = [e for e in log if e["event"] == "sapo_node_capped"]
        assert {e["peer"] for e in capped} == {f"tcp://127.0.0.1:{ports['flood']}"}, capped
        assert all(e["kept"] == OWN for e in capped) and len(capped) == ROUNDS, capped
        assert summary["refused"] == {"bad_token": ROUNDS, "held_out": ROUNDS}, (name, summary)
        refusals = [e for e in log if e["event"] == "sapo_node_refused"]
        by_peer = {e["peer"]: e["reason"] for e in refusals}
        assert by_peer == {f"tcp://127.0.0.1:{ports['garbage']}": "bad_token",
                           f"tcp://127.0.0.1:{ports['held_out']}": "held_out"}, by_peer
    assert sum(used.values()) > 0, f"no shared group reached an update: {used}"
    print(f"ok: {len(NODES)} nodes x {ROUNDS} rounds; the honest nodes took {ROUNDS * OWN} groups "
          "from each other and as many from the flooding node, and refused the garbage and "
          f"held-out nodes' every round; shared groups in their updates: {used}")


if __name__ == "__main__":
    main()
