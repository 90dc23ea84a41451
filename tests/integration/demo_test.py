#!/usr/bin/env python3
"""`agora demo`, as `make demo` runs it but short: a coordinator and two peers train 8 steps of the
demo config. It must exit 0, print the page's address, a row per step and the summary, and the
address must answer while the run is on; the peers (logging JSON into OUT_DIR) must both record
finishing after every step with the same parameters. Usage: demo_test.py AGORA OUT_DIR (run from
the source folder, where configs/ and data/ are)."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

PEERS, STEPS = 2, 8

agora, out = sys.argv[1:3]
process = subprocess.Popen(
    [agora, "demo", "--peers", str(PEERS), "--steps", str(STEPS), "--config",
     "configs/network-demo.toml", "--out", out, "--log-format", "json"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
lines, page, poller = [], None, None


def poll(url):
    """The demo prints the address before its coordinator listens: ask until it answers, for as
    long as the demo runs."""
    global page
    while process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                page = response.status
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)


for line in process.stdout:
    lines.append(line)
    match = re.match(r"dashboard: (http://\S+)", line)
    if match and poller is None:
        poller = threading.Thread(target=poll, args=(match.group(1) + "api/run",), daemon=True)
        poller.start()
status = process.wait(timeout=300)
if poller:
    poller.join(timeout=15)
text = "".join(lines)
problems = []
if status != 0:
    problems.append(f"agora demo exited with {status}")
if page != 200:
    problems.append(f"the dashboard address did not answer (status {page})")
# The table is what a person reads, so it is read as text: one row per step, each with every
# peer's payload in the step.
rows = re.findall(rf"^\s+(\d+)\s+\d+\.\d+\s+{PEERS}\s", text, re.M)
if [int(r) for r in rows] != list(range(STEPS)):
    problems.append(f"step rows {rows}, expected 0..{STEPS - 1} with {PEERS} peers each")
if not re.search(rf"agora demo: {STEPS} steps in .* with {PEERS} peers; loss", text):
    problems.append("no summary line")
# The peers' JSON logs (OUT_DIR/peer-N.log): "finished" after all the steps, one state hash.
ends = {}
for i in range(PEERS):
    path = os.path.join(out, f"peer-{i}.log")
    finished = []
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict) and j.get("event") == "finished":
            finished.append((j["applied_steps"], j["hash"]))
    ends[i] = finished[-1] if finished else None
if any(end is None or end[0] != STEPS for end in ends.values()) or len(set(ends.values())) != 1:
    problems.append(f"the peers finished {ends}, expected all after {STEPS} steps with one hash")
if problems:
    print(text)
    sys.exit("FAIL: " + "; ".join(problems))
print(f"agora demo: exit 0, dashboard answered, {STEPS} step rows and the summary; "
      f"{PEERS} peers finished identical")
