#!/usr/bin/env python3
"""Runs bench_tst briefly (tiny preset) and checks what it writes: the JSON's runs, curves and
switch step, the CSV and both PNG plots. Usage: check_smoke.py BENCH_TST DATA_DIR OUT_DIR"""
import json
import os
import shutil
import subprocess
import sys

bench, data, out = sys.argv[1:4]
shutil.rmtree(out, ignore_errors=True)
steps, fraction = 12, 0.25
subprocess.run([bench, "--data", data, "--preset", "tiny", "--seq-len", "32", "--steps",
                str(steps), "--eval-interval", "3", "--eval-windows", "4", "--warmup", "2",
                "--bags", "2", "--fraction", str(fraction), "--threads", "1", "--out", out,
                "--json", os.path.join(out, "tst.json")], check=True)
with open(os.path.join(out, "tst.json")) as f:
    result = json.load(f)
runs = {r["name"]: r for r in result["runs"]}
assert set(runs) == {"baseline", "tst_s2"}, runs.keys()
assert result["switch_step"] == round(fraction * steps) == runs["tst_s2"]["switch_step"]
assert runs["baseline"]["switch_step"] == 0
for run in runs.values():
    steps_seen = [p["step"] for p in run["curve"]]
    assert steps_seen == [3, 6, 9, 12], steps_seen
    # The bag loss is reported exactly while the model has trained on bags only.
    bagged = [p["step"] for p in run["curve"] if p["bag_val_loss"] is not None]
    assert bagged == ([3] if run["bag"] > 1 else []), (run["name"], bagged)
# TST reads bag times more data in phase 1 at the same number of positions.
assert runs["tst_s2"]["data_tokens"] == 8 * 32 * (3 * 2 + 9), runs["tst_s2"]["data_tokens"]
assert runs["baseline"]["speedup"] == 1.0
for name in ("tst.csv", "loss_vs_steps.png", "loss_vs_time.png"):
    path = os.path.join(out, name)
    assert os.path.getsize(path) > 200, f"{path} is missing or empty"
print("bench_tst smoke: ok")
