#!/usr/bin/env python3
"""Every role that serves members, from one table (serve/members.h; docs/architecture.md,
"Serving members").

    serve_roles_test.py AGORA PROBE DATA_DIR OUT [ROLE ...]

Each role in ROLES (the data-parallel coordinator, the asynchronous outer server, the RL learner,
the swarm coordinator, a data-parallel peer's own server, a SAPO node) is started as a real
process, open to any key where it has members who say hello, and knocked on by agora_probe
(tests/adversary/agora_probe.cc), a stranger. Checked the same way for every role:
  - a stranger's message (a heartbeat, without a hello) gets the one refusal (serve::refusal):
    the reason serve::kNotAMember with may_rejoin, or for a peer's server, whose members the
    coordinator names, peer::kNotAdmitted; a role that admits only named keys at the CURVE
    handshake (a SAPO node, its peers) answers a stranger nothing at all;
  - a stranger's flood of FLOOD messages gets at most the strangers' budget of refusals back:
    burst + rate x the seconds it lasted, the budget the role logs when it starts (the
    coordinator's is service.h's);
  - a frame of 2 MiB, above every role's control limit, is dropped, and the next stranger is
    still answered;
  - the status server (async, RL, swarm: --http) serves the role's page, the files it loads,
    /api/<role> and agora_<role>_* metrics, and 404 for anything else;
  - SIGINT mid-run ends the process with exit 0, and its final artefact is written (the
    coordinator's database, the asynchronous run's summary and checkpoint, the learner's
    checkpoint and intake summary, the swarm's summary, the peer's "left" event, the SAPO node's
    summary).
"""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network_run import free_port  # noqa: E402
from rl_network_test import make_base  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOT_A_MEMBER_PREFIX = "not a member: say hello first"
FLOOD = 5000
# The coordinator's budget (coord/service.h): 100 messages a second, bursts of 1000, for all keys
# that never joined together.
COORDINATOR_RATE, COORDINATOR_BURST = 100.0, 1000.0
# A peer's server answers strangers at most 20 times a second in all, bursts of 20
# (peer/peer_server.h, PeerServerLimits::refusal_replies_per_second).
PEER_REFUSALS = 20.0


def events(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line still being written
    return out


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def wait_for_event(proc, path, name, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = next((e for e in events(path) if e.get("event") == name), None)
        if found:
            return found
        if proc.poll() is not None:
            sys.exit(f"FAILED: the process exited ({proc.returncode}) before logging {name}")
        time.sleep(0.1)
    sys.exit(f"FAILED: no {name} event in {path} after {seconds} s")


# ---- the roles: how each starts, where it listens, its strangers' budget, its final artefact

def start_coordinator(ctx):
    port = free_port()
    out = ctx["dir"]
    proc = subprocess.Popen(
        [ctx["agora"], "coordinator", "--config", os.path.join(ROOT, "tests/integration/network.toml"),
         "--key", ctx["key_file"], "--json", "--log-format", "json",
         "--set", f'network.listen="tcp://127.0.0.1:{port}"', "--set", "network.open=true",
         "--set", f'network.state_db="{out}/coordinator.db"', "--set", f"data.dir={ctx['data']}"],
        stdout=open(f"{out}/stdout.jsonl", "w"), stderr=open(f"{out}/stderr.log", "w"))
    # It listens once it has opened its database and bound the port.
    deadline = time.time() + 60
    while time.time() < deadline and "coordinator" not in open(f"{out}/stderr.log").read():
        if proc.poll() is not None:
            sys.exit(f"FAILED: the coordinator exited ({proc.returncode})")
        time.sleep(0.1)
    return proc, f"tcp://127.0.0.1:{port}", COORDINATOR_RATE, COORDINATOR_BURST, None


def final_coordinator(ctx):
    db = sqlite3.connect(f"{ctx['dir']}/coordinator.db")
    bound = dict(db.execute("SELECT key, value FROM meta").fetchall())
    assert bound.get("run_id"), f"the coordinator's database holds no run: {bound}"


def start_async(ctx):
    out = f"{ctx['dir']}/async"
    proc = subprocess.Popen(
        [ctx["agora"], "async", "serve", "--config", os.path.join(ROOT, "bench/async/async.toml"),
         "--set", f"data.dir={ctx['data']}", "--set", "train.eval_windows=2",
         "--key", ctx["key_file"], "--listen", "tcp://127.0.0.1:*", "--open", "--workers", "1",
         "--seconds", "600", "--eval-every", "300", "--http", "127.0.0.1:0", "--out", out],
        stdout=open(f"{ctx['dir']}/stdout.log", "w"), stderr=subprocess.STDOUT)
    start = wait_for_event(proc, f"{out}/events.jsonl", "async_start")
    return proc, start["listen"], start["stranger_rate"], start["stranger_burst"], start["http"]


def final_async(ctx):
    out = f"{ctx['dir']}/async"
    names = [e["event"] for e in events(f"{out}/events.jsonl")]
    # No worker joined, so the run never started: nothing to validate, but the summary and theta.
    assert "async_summary" in names, names
    assert os.path.exists(f"{out}/final/config.json"), "no final checkpoint"


def start_rl(ctx):
    out = f"{ctx['dir']}/rl"
    proc = subprocess.Popen(
        [ctx["agora"], "rl", "serve", "--checkpoint", ctx["rl_base"], "--key", ctx["key_file"],
         "--listen", "tcp://127.0.0.1:*", "--open", "--steps", "100", "--eval-problems", "4",
         "--eval-interval", "0", "--http", "127.0.0.1:0", "--out", out],
        stdout=open(f"{ctx['dir']}/stdout.log", "w"), stderr=subprocess.STDOUT)
    start = wait_for_event(proc, f"{out}/rl.jsonl", "rl_learner")
    return proc, start["listen"], start["stranger_rate"], start["stranger_burst"], start["http"]


def final_rl(ctx):
    out = f"{ctx['dir']}/rl"
    assert any(e["event"] == "rl_intake" for e in events(f"{out}/rl.jsonl")), "no rl_intake"
    assert os.path.exists(f"{out}/latest/config.json"), "no checkpoint"


def start_swarm(ctx):
    out = f"{ctx['dir']}/swarm"
    proc = subprocess.Popen(
        [ctx["agora"], "swarm", "serve", "--config", os.path.join(ROOT, "configs/swarm.toml"),
         "--set", f"data.dir={ctx['data']}", "--key", ctx["key_file"],
         "--listen", "tcp://127.0.0.1:*", "--open", "--http", "127.0.0.1:0", "--out", out],
        stdout=open(f"{ctx['dir']}/stdout.log", "w"), stderr=subprocess.STDOUT)
    start = wait_for_event(proc, f"{out}/events.jsonl", "swarm_serve")
    http = wait_for_event(proc, f"{out}/events.jsonl", "swarm_http")["url"]
    return proc, start["listen"], start["stranger_rate"], start["stranger_burst"], http


def final_swarm(ctx):
    summary = [e for e in events(f"{ctx['dir']}/swarm/events.jsonl")
               if e["event"] == "swarm_summary"]
    assert summary and summary[-1]["steps"] == 0, summary


def start_peer(ctx):
    """A data-parallel peer's own server (peer/peer_server.h). Its members are the ones the
    coordinator lists, never a hello: a stranger gets the refusal with the peer's own reason, at
    most refusal_replies_per_second in all (burst the same)."""
    coordinator, coordinator_endpoint, _, _, _ = start_coordinator(ctx)
    ctx["others"] = [coordinator]
    port = free_port()
    key_file = f"{ctx['dir']}/peer.key"
    ctx["server_key"] = run([ctx["agora"], "keygen", "--out", key_file]).strip().split()[-1]
    log = f"{ctx['dir']}/peer.log"
    proc = subprocess.Popen(
        [ctx["agora"], "peer", "--coordinator", coordinator_endpoint, "--coordinator-key",
         ctx["key"], "--key", key_file, "--data", ctx["data"],
         "--listen", f"tcp://127.0.0.1:{port}", "--threads", "1", "--log-format", "json",
         "--checkpoint-dir", f"{ctx['dir']}/ckpt"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    # It serves once it joined (network.toml's min_peers = 2 keeps the run waiting for another).
    wait_for_event(proc, log, "joined")
    return proc, f"tcp://127.0.0.1:{port}", PEER_REFUSALS, PEER_REFUSALS, None


def final_peer(ctx):
    assert any(e.get("event") == "left" for e in events(f"{ctx['dir']}/peer.log")), \
        "the peer did not leave the run on SIGINT"


def start_sapo(ctx):
    """A SAPO node: its server admits only its configured peers at the CURVE handshake (one
    unreachable peer here), so a stranger's connection never completes and nothing it sends is
    read, let alone answered."""
    out = f"{ctx['dir']}/sapo"
    peer = run([ctx["agora"], "keygen", "--out", f"{ctx['dir']}/peer.key"]).strip().split()[-1]
    port = free_port()
    proc = subprocess.Popen(
        [ctx["agora"], "rl", "sapo-node", "--checkpoint", ctx["rl_base"], "--key", ctx["key_file"],
         "--listen", f"tcp://127.0.0.1:{port}", "--peer", f"tcp://127.0.0.1:{free_port()}@{peer}",
         # It serves while it waits for its peers' groups: a share wait of 2 s a round.
         "--rounds", "100000", "--own", "1", "--shared", "1", "--share-wait", "2",
         "--group", "2", "--max-new-tokens", "4",
         "--eval-problems", "4", "--linger", "0", "--out", out],
        stdout=open(f"{ctx['dir']}/stdout.log", "w"), stderr=subprocess.STDOUT)
    wait_for_event(proc, f"{out}/sapo.jsonl", "sapo_node_start")
    ctx["ask"] = "sapo-groups"  # what an open node would answer
    return proc, f"tcp://127.0.0.1:{port}", 0, 0, None


def final_sapo(ctx):
    log = events(f"{ctx['dir']}/sapo/sapo.jsonl")
    assert any(e["event"] == "sapo_node_summary" for e in log), "no sapo_node_summary"


# name: (start, final artefact, the refusal's reason; None for a role closed at the handshake)
ROLES = {
    "coordinator": (start_coordinator, final_coordinator, NOT_A_MEMBER_PREFIX),
    "async": (start_async, final_async, NOT_A_MEMBER_PREFIX),
    "rl": (start_rl, final_rl, NOT_A_MEMBER_PREFIX),
    "swarm": (start_swarm, final_swarm, NOT_A_MEMBER_PREFIX),
    "peer": (start_peer, final_peer, "agora: not a current member of the run"),
    "sapo": (start_sapo, final_sapo, None),
}


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def check_status_server(name, http):
    """The one status server (serve/status_server.h): the role's page, what it loads, its API
    and its metrics."""
    status, kind, page = get(http + "/")
    assert status == 200 and kind.startswith("text/html"), (name, status, kind)
    assert f"<title>agora {name}</title>" in page and f"/api/{name}" in page, page[:300]
    for asset in ("/role_page.js", "/role_page.css"):
        assert asset in page, f"{name}: the page does not load {asset}"
        assert get(http + asset)[0] == 200, (name, asset)
    api = json.loads(get(http + f"/api/{name}")[2])
    assert isinstance(api, dict) and api, f"{name}: /api/{name} is {api!r}"
    metrics = get(http + "/metrics")[2]
    assert f"# TYPE agora_{name}_" in metrics, f"{name}: no agora_{name}_* metrics"
    try:
        get(http + "/no-such-page")
        raise AssertionError(f"{name}: an unknown path was answered")
    except urllib.error.HTTPError as e:
        assert e.code == 404, (name, e.code)


def check_answers(name, reason, rate, burst, stranger, flood, over):
    """A role that answers strangers: the one refusal, within the strangers' budget."""
    assert stranger["answered"], f"{name}: a stranger's heartbeat got no refusal: {stranger}"
    assert stranger["refusal"]["reason"].startswith(reason), (name, stranger)
    assert stranger["refusal"]["may_rejoin"], (name, stranger)
    # The probe reads answers for 3 s after sending; the budget over that window, with one
    # second of slack for the sending itself.
    bound = burst + rate * (3.0 + 1.0)
    assert 0 < flood["refusals"] <= bound, f"{name}: {flood} refusals, budget {bound:.0f}"
    assert flood["refusals"] < FLOOD, f"{name}: the flood was answered in full: {flood}"
    assert over["refusals"] == 0, f"{name}: the oversized frame was answered: {over}"
    assert over["after"]["answered"], f"{name}: no answer after the oversized frame: {over}"


def check_role(name, ctx):
    start, final, reason = ROLES[name]
    proc, endpoint, rate, burst, http = start(ctx)
    try:
        if http:
            check_status_server(name, http)
        probe = json.loads(run([ctx["probe"], "--endpoint", endpoint, "--server-key",
                                ctx.get("server_key", ctx["key"]), "--flood", str(FLOOD),
                                "--seconds", "10" if reason else "3",
                                "--ask", ctx.get("ask", "heartbeat")]))
        with open(f"{ctx['dir']}/probe.json", "w") as f:
            json.dump(probe, f, indent=1)
        stranger, flood, over = probe["stranger"], probe["flood"], probe["oversized"]
        if reason is None:
            # Closed at the handshake: not one answer to anything a stranger sends.
            assert probe["answers"] == 0, (name, probe)
            bound = 0
        else:
            check_answers(name, reason, rate, burst, stranger, flood, over)
            bound = burst + rate * (3.0 + 1.0)
        assert proc.poll() is None, f"{name}: exited during the probe ({proc.returncode})"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        assert code == 0, f"{name}: exit {code} after SIGINT (see {ctx['dir']})"
        final(ctx)
    finally:
        for p in [proc, *ctx.get("others", [])]:
            if p.poll() is None:
                p.kill()
                p.wait()
    if reason is None:
        print(f"ok {name}: closed to strangers at the handshake (no answer to a heartbeat, "
              f"{FLOOD} flooded messages or a {over['bytes']} byte frame), clean exit on SIGINT")
        return
    print(f"ok {name}: refused a stranger ('{stranger['refusal']['reason'][:40]}...'), "
          f"{flood['refusals']} refusals for {FLOOD} flooded messages (budget {bound:.0f}), "
          f"survived a {over['bytes']} byte frame, clean exit on SIGINT")


def main():
    agora, probe, data, out = sys.argv[1:5]
    names = sys.argv[5:] or list(ROLES)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    key_file = f"{out}/server.key"
    key = run([agora, "keygen", "--out", key_file]).strip().split()[-1]
    rl_base = None
    if "rl" in names or "sapo" in names:
        os.makedirs(f"{out}/rl-base")
        rl_base = make_base(agora, f"{out}/rl-base")
    for name in names:
        role_dir = f"{out}/{name}"
        os.makedirs(role_dir)
        check_role(name, {"agora": agora, "probe": probe, "data": data, "dir": role_dir,
                          "key_file": key_file, "key": key, "rl_base": rl_base})
    print(f"{len(names)} passed, 0 failed")


if __name__ == "__main__":
    main()
