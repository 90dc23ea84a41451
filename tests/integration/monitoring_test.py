#!/usr/bin/env python3
"""The coordinator's JSON API, /metrics of the coordinator and a peer, and JSON log lines,
against a real small run (2 peers, the tiny model, 30 steps).

    monitoring_test.py AGORA DATA_DIR ARTIFACTS_DIR

While the run trains and once it finished, it checks /api/run, /api/peers and /api/history
(steps increase, the loss is finite and falls, both peers are active with shares summing to 1,
the events hold the joins), scrapes /metrics of the coordinator and of peer 0, lints both with
`promtool check metrics`, and checks the `--log-format json` lines: every line of the coordinator
and of the peers parses and carries its fixed keys, and peer 0's structured events ("joined",
"state", "trained", "finished", "summary") agree with the run. The scraped texts and
API answers are written to ARTIFACTS_DIR (coordinator.metrics.txt, peer.metrics.txt,
api_run.json, api_peers.json, api_history.json) for the dashboard test and for people.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network_run import Run, free_port  # noqa: E402

STEPS = 30
EVAL_INTERVAL = 5  # train.eval_interval: the checkpointer's validation loss every 5 steps

# Every metric the dashboards may query, per process (obs/metrics_catalogue.h). Gauges that are
# set only once known (loss) are checked after training started.
COORDINATOR_METRICS = [
    "agora_run_info", "agora_run_phase", "agora_run_finalized_steps", "agora_run_total_steps",
    "agora_run_loss", "agora_run_learning_rate", "agora_run_tokens_per_second", "agora_run_peers",
    "agora_run_round_duration_seconds_bucket", "agora_run_deadline_misses_total",
    "agora_run_joins_total", "agora_run_leaves_total", "agora_run_drops_total",
    "agora_run_refusals_total", "agora_run_commits_total", "agora_run_payloads_total",
    "agora_run_payload_rejections_reported_total", "agora_run_payload_bytes_total",
    "agora_run_allreduce_equivalent_bytes_total", "agora_run_checkpoints_total",
    "agora_run_resyncs_total", "agora_run_restarts_total", "agora_run_messages_throttled_total",
    "agora_run_round_starts_held_total",
    "agora_run_reports_refused_total", "agora_run_witnesses_repeated_total",
    "agora_run_witness_disagreements_total", "agora_run_events_suppressed_total",
    "agora_network_bytes_total",
    "process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"]
PEER_METRICS = [
    "agora_peer_step", "agora_peer_loss", "agora_peer_learning_rate",
    "agora_peer_tokens_per_second", "agora_peer_share", "agora_peer_time_seconds_total",
    "agora_network_bytes_total", "agora_peer_payloads_accepted_total",
    "agora_peer_payloads_rejected_total", "agora_peer_fetch_duration_seconds_bucket",
    "agora_peer_checkpoint_duration_seconds_bucket", "agora_peer_rounds_total",
    "agora_peer_resyncs_total", "agora_peer_requests_refused_total",
    "agora_peer_witnesses_early_total", "agora_peer_payloads_late_total",
    "agora_peer_unsolicited_replies_total", "agora_peer_io_errors_total", "agora_peer_fetch_connections",
    "process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def get_json(url):
    return json.loads(get(url))


def samples(text):
    """metric name -> list of (labels text, value) from an exposition text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out.setdefault(name, []).append((name_labels[len(name):], float(value)))
    return out


def promtool(run, text, what):
    if shutil.which("promtool") is None:
        run.fail("promtool is missing: scripts/setup.sh installs it (Debian package prometheus)")
    result = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                            capture_output=True)
    if result.returncode != 0:
        run.fail(f"promtool check metrics refused the {what}:\n{result.stdout}{result.stderr}")


def check_peers(run, peers, when):
    if len(peers) != 2:
        run.fail(f"{when}: /api/peers lists {len(peers)} peers, expected 2: {peers}")
    for p in peers:
        for field in ("key", "short", "state", "endpoint", "agent", "sequences_per_second",
                      "share", "strikes", "last_seen_seconds_ago", "applied_steps",
                      "checkpointer", "payload_bytes", "commits"):
            if field not in p:
                run.fail(f"{when}: a peer lacks {field}: {p}")
        if p["state"] != "active":
            run.fail(f"{when}: peer {p['short']} is {p['state']}, expected active")
    total = sum(p["share"] for p in peers)
    if abs(total - 1.0) > 0.01:
        run.fail(f"{when}: the peers' shares sum to {total}, expected 1: {peers}")


def check_history(run, history, when, at_least):
    steps = history["steps"]
    numbers = [r["step"] for r in steps]
    if numbers != list(range(len(steps))) or len(steps) < at_least:
        run.fail(f"{when}: /api/history steps are {numbers}, expected 0..{at_least - 1} at least")
    losses = [r["loss"] for r in steps]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        run.fail(f"{when}: losses are not all finite: {losses}")
    for r in steps:
        for field in ("lr", "tokens_per_second", "payload_bytes", "allreduce_bytes", "peers",
                      "seconds", "at"):
            if field not in r:
                run.fail(f"{when}: a step row lacks {field}: {r}")
    joins = [e for e in history["events"] if e["kind"] == "join"]
    if len(joins) < 2:
        run.fail(f"{when}: {len(joins)} join events, expected 2: {history['events'][:6]}")
    return losses


def check_json_logs(run, path, process):
    """Every line that starts with '{' is a JSON log line with its fixed keys; returns them. Other
    lines (the peer's closing summary on stdout, libtorch's warnings) are not log lines."""
    lines = []
    for line in open(path, errors="replace"):
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except ValueError:
            run.fail(f"{path}: a log line is not JSON: {line!r}")
        for field in ("ts", "level", "msg", "process"):
            if field not in j:
                run.fail(f"{path}: a log line lacks {field}: {line!r}")
        if j["process"] != process:
            run.fail(f"{path}: process is {j['process']}, expected {process}")
        if process == "peer" and ("peer" not in j or "step" not in j):
            run.fail(f"{path}: a peer line lacks its peer id or step: {line!r}")
        lines.append(j)
    return lines


def check_peer_events(run, i, lines):
    """Peer i's structured events against the run it took part in from start to finish."""
    events = {}
    for j in lines:
        if "event" in j:
            events.setdefault(j["event"], []).append(j)
    if [j["peer"] for j in lines if j["peer"] != run.short(i)]:
        run.fail(f"peer {i}'s lines name another peer than {run.short(i)}")
    if len(events.get("joined", [])) != 1:
        run.fail(f"peer {i} recorded {len(events.get('joined', []))} joins, expected 1")
    # A state report at every multiple of network.hash_interval applied steps, 0 to the end.
    k = run.hash_interval
    reported = {e["applied_steps"] for e in events.get("state", [])}
    expected = set(range(0, STEPS + 1, k))
    if not expected <= reported:
        run.fail(f"peer {i} reported no state after {sorted(expected - reported)} steps")
    # Its shares of the rounds it trained: at most the global batch each.
    trained = events.get("trained", [])
    if not trained or any(not 0 < e["sequences"] <= run.batch_size for e in trained):
        run.fail(f"peer {i}'s trained rounds: {[(e['round'], e['sequences']) for e in trained]}")
    finished = events.get("finished", [])
    if len(finished) != 1 or finished[0]["applied_steps"] != STEPS:
        run.fail(f"peer {i} finished {finished}, expected once after {STEPS} steps")
    summary = events.get("summary", [])
    # Two members: it fetched the other's payload of every step the other authored.
    if len(summary) != 1 or summary[0]["payloads_fetched"] < 1 or summary[0]["bytes_received"] <= 0:
        run.fail(f"peer {i}'s summary {summary}: expected one, with payloads fetched")
    return events


def main(agora, data, artifacts):
    os.makedirs(artifacts, exist_ok=True)
    # The checkpointer validates every 5 steps, which gives the page its validation curve.
    run = Run(agora, data, "monitoring", peers=2, steps=STEPS,
              sets=["network.min_peers=2", f"train.eval_interval={EVAL_INTERVAL}",
                    "train.eval_windows=4"])
    http, metrics = free_port(), free_port()
    api = f"http://127.0.0.1:{http}"
    run.start_coordinator(extra=("--http", f"127.0.0.1:{http}", "--log-format", "json"))
    # Run.start_peer passes --log-format json to every peer.
    run.start_peer(0, extra=["--metrics", f"127.0.0.1:{metrics}"])
    run.start_peer(1)

    def api_up():
        try:
            get_json(api + "/api/run")
            return True
        except OSError:
            return False

    run.wait_until("the coordinator's HTTP API", api_up, 30)
    page = get(api + "/")
    if "<html" not in page.lower():
        run.fail(f"/ is not the web page: {page[:200]!r}")

    # While it trains.
    run.wait_until("5 finalized steps", lambda: get_json(api + "/api/run")["step"] >= 5, 90)
    first = get_json(api + "/api/run")
    check_peers(run, get_json(api + "/api/peers"), "while training")
    check_history(run, get_json(api + "/api/history"), "while training", 5)
    # /api/run's step counts finalized steps, so the newest row is step - 1; since=S returns the
    # rows after step S.
    newest = first["step"] - 1
    since = get_json(api + f"/api/history?since={newest - 1}")["steps"]
    if not since or since[0]["step"] != newest:
        run.fail(f"/api/history?since={newest - 1} starts at "
                 f"{since[0]['step'] if since else None}, expected {newest}")
    run.wait_until("more steps", lambda: get_json(api + "/api/run")["step"] > first["step"] + 3, 60)
    if first["phase"] != "training" or first["total_steps"] != STEPS:
        run.fail(f"/api/run while training: {first}")
    for field in ("run_id", "loss", "learning_rate", "tokens_per_second", "payload_bytes_per_step",
                  "allreduce_bytes_per_step", "peers", "counters", "started_at",
                  "uptime_seconds", "model"):
        if field not in first:
            run.fail(f"/api/run lacks {field}: {first}")
    if first["peers"].get("active") != 2 or first["model"].get("preset") != "tiny":
        run.fail(f"/api/run: {first['peers']}, {first['model']}")

    # Both /metrics while the peer still runs (a peer exits with the run).
    run.wait_until("15 finalized steps", lambda: get_json(api + "/api/run")["step"] >= 15, 90)
    coordinator_text = get(api + "/metrics")
    # What the coordinator heard from peer 0 (heartbeats, commits) before its /metrics is read:
    # the peer's own counters can only be at or past it.
    told = {p["short"]: p for p in get_json(api + "/api/peers")}.get(run.short(0))
    peer_text = get(f"http://127.0.0.1:{metrics}/metrics")
    with open(os.path.join(artifacts, "coordinator.metrics.txt"), "w") as f:
        f.write(coordinator_text)
    with open(os.path.join(artifacts, "peer.metrics.txt"), "w") as f:
        f.write(peer_text)
    for text, names, what in ((coordinator_text, COORDINATOR_METRICS, "coordinator's metrics"),
                              (peer_text, PEER_METRICS, "peer's metrics")):
        promtool(run, text, what)
        present = samples(text)
        missing = [n for n in names if n not in present]
        if missing:
            run.fail(f"the {what} lack {missing}")
    c = samples(coordinator_text)
    if c["agora_run_finalized_steps"][0][1] < 15 or c["agora_run_payload_bytes_total"][0][1] <= 0:
        run.fail("the coordinator's metrics do not show the steps and bytes so far")
    if dict(c["agora_run_peers"]).get('{state="active"}') != 2:
        run.fail(f"agora_run_peers: {c['agora_run_peers']}")
    p = samples(peer_text)
    if told is None:
        run.fail(f"/api/peers does not list peer 0 ({run.short(0)})")
    # Steps applied and rounds trained: at least what the peer had told the coordinator (its
    # applied steps, its commits), and more than none.
    if not p["agora_peer_step"][0][1] >= max(1, told["applied_steps"]) or \
            not p["agora_peer_rounds_total"][0][1] >= max(1, told["commits"]):
        run.fail(f"the peer's metrics (step {p['agora_peer_step']}, rounds "
                 f"{p['agora_peer_rounds_total']}) are behind what it told the coordinator: "
                 f"{told['applied_steps']} applied, {told['commits']} commits")
    received = dict(p["agora_network_bytes_total"])
    if received.get('{direction="received",kind="payload"}', 0) <= 0:
        run.fail(f"the peer received no payload bytes: {received}")

    # Once finished: the coordinator lingers 3 s, answering.
    run.wait_until("the finished phase", lambda: get_json(api + "/api/run")["phase"] == "finished",
                   120)
    final = get_json(api + "/api/run")
    peers = get_json(api + "/api/peers")
    history = get_json(api + "/api/history")
    final_metrics = get(api + "/metrics")
    for name, value in (("api_run", final), ("api_peers", peers), ("api_history", history)):
        with open(os.path.join(artifacts, name + ".json"), "w") as f:
            json.dump(value, f, indent=1)
    run.wait_finished()
    if final["step"] != STEPS:
        run.fail(f"/api/run says {final['step']} steps at the end, expected {STEPS}")
    check_peers(run, peers, "after the run")
    losses = check_history(run, history, "after the run", STEPS)
    # The checkpointer validates before training every train.eval_interval-th step but step 0.
    validated = [r["step"] for r in history["steps"] if r.get("val_loss") is not None]
    expected = list(range(EVAL_INTERVAL, STEPS, EVAL_INTERVAL))
    if validated != expected:
        run.fail(f"validation losses at steps {validated}, expected {expected}")
    if not math.isfinite(final.get("val_loss") or math.nan):
        run.fail(f"/api/run has no validation loss at the end: {final}")
    if "agora_run_val_loss" not in samples(final_metrics):
        run.fail("the coordinator does not export agora_run_val_loss")
    run.check_loss_falls(losses)
    coordinator = check_json_logs(run, os.path.join(run.dir, "coordinator.log"), "coordinator")
    # With --json the events go to stdout; stderr keeps the start line and the closing line,
    # which counts every step final.
    if len(coordinator) < 2 or coordinator[-1].get("step") != STEPS:
        run.fail(f"the coordinator's JSON log: {coordinator[-2:]}, expected its start and its "
                 f"closing line at step {STEPS}")
    peers = [check_json_logs(run, os.path.join(run.dir, f"peer-{i}.log"), "peer") for i in (0, 1)]
    for i in (0, 1):
        check_peer_events(run, i, peers[i])
    # The checkpointer (network.checkpointers = 1: one of the two) validated at the same steps
    # as the coordinator's history shows.
    val = sorted(e["round"] for lines in peers for e in lines if e.get("event") == "validation")
    if val != expected:
        run.fail(f"the peers recorded validation at rounds {val}, expected {expected}")
    run.check_identical([0, 1], throughout=[0, 1])
    print(f"API checked while training and after {STEPS} steps; /metrics of both processes pass "
          f"promtool; {len(coordinator) + sum(map(len, peers))} JSON log lines parse, peer "
          f"events agree with the run; artifacts in {artifacts}")
    run.cleanup()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: monitoring_test.py AGORA DATA_DIR ARTIFACTS_DIR")
    main(*sys.argv[1:])
