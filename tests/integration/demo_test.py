#!/usr/bin/env python3
"""`agora demo`, as `make demo` runs it but short: a coordinator and two peers train 8 steps of the
demo config. It must exit 0, print the page's address, a row per step and the summary, and the
address must answer while the run is on. Usage: demo_test.py AGORA OUT_DIR (run from the source
folder, where configs/ and data/ are)."""
import re
import subprocess
import sys
import urllib.request

agora, out = sys.argv[1:3]
process = subprocess.Popen(
    [agora, "demo", "--peers", "2", "--steps", "8", "--config", "configs/network-demo.toml",
     "--out", out],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
lines, page = [], None
for line in process.stdout:
    lines.append(line)
    match = re.match(r"dashboard: (http://\S+)", line)
    if match and page is None:
        with urllib.request.urlopen(match.group(1) + "api/run", timeout=10) as response:
            page = response.status
status = process.wait(timeout=300)
text = "".join(lines)
problems = []
if status != 0:
    problems.append(f"agora demo exited with {status}")
if page != 200:
    problems.append(f"the dashboard address did not answer (status {page})")
rows = re.findall(r"^\s+(\d+)\s+\d+\.\d+\s+2\s", text, re.M)
if [int(r) for r in rows] != list(range(8)):
    problems.append(f"step rows {rows}, expected 0..7")
if not re.search(r"agora demo: 8 steps in .* with 2 peers; loss", text):
    problems.append("no summary line")
if problems:
    print(text)
    sys.exit("FAIL: " + "; ".join(problems))
print("agora demo: exit 0, dashboard answered, 8 step rows and the summary")
