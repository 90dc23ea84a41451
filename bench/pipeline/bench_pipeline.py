#!/usr/bin/env python3
"""bench/pipeline: what compressing the stage boundaries and dropping the flush cost a pipeline.

    bench_pipeline.py --agora build/apps/agora/agora [--config configs/pipeline.toml]
                      [--scenario codecs|schedules|layouts|all] [--steps N] [--out DIR]
                      [--families float32,bfloat16,int8,subspace,columns]
                      [--json FILE] [--set key=value ...]

Side by side in one invocation, each variant an `agora train` of the same config (the in-process
pipeline, pipeline/simulation.h), read back from its pipeline.jsonl events:

  codecs     gpipe with S = 4: float32, bfloat16, int8, subspace at k/d = 1/4, 1/8, 1/16,
             1/32, and the column sparsifier keeping 1/4, 1/8, 1/16 of the columns: validation
             loss against steps, final validation loss against float32's, and the bytes per
             token each boundary carried forward and backward. --families picks which of them
             run (float32 always does: the others are measured against it).
  schedules  on the same steps: synchronous AdamW (gpipe), asynchronous AdamW and asynchronous
             NAdam(beta1 0.99) (1F1B with weight stashing, stage i stale by S - 1 - i updates).
  layouts    bytes per token per boundary for the 1b and a 40B-class geometry, from the layouts
             alone (exact; no training).
  processes  one `agora stage` process per stage, each boundary through `agora link` shaped to
             --link (default rate=80mbit,delay=50ms each way): tokens/s (from the --skip-th
             step to the last) and loss per step of synchronous AdamW (gpipe) against
             asynchronous NAdam (1F1B), and each stage process's peak RSS against the whole
             model trained in one process (`agora train` with pipeline.stages = 1).
             --process-stages S (4) and --pin (stage i on core i) measure the schedules with
             a core per stage: on a 2-core machine, S = 2 pinned.

Writes OUT/pipeline.csv (step, variant, val_loss) and OUT/pipeline_codecs.png and
OUT/pipeline_schedules.png (gnuplot), and --json. Losses are the result; the in-process tokens/s
says nothing of a network (every stage shares this machine's cores).
"""
import argparse
import random
import socket
import tempfile
import json
import os
import subprocess
import sys
import time


def run_variant(agora, config, name, sets, steps, out):
    run_dir = os.path.join(out, name)
    args = [agora, "train", "--config", config, "--quiet",
            "--set", f"train.out_dir={run_dir}", "--set", f"train.steps={steps}"]
    for s in sets:
        args += ["--set", s]
    started = time.time()
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name}: agora train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in open(os.path.join(run_dir, "pipeline.jsonl"))]
    finish = next(e for e in events if e["event"] == "finish")
    evals = [(e["step"], e["val_loss"]) for e in events if e["event"] == "eval"]
    losses = [e["loss"] for e in events if e["event"] == "step"]
    return {
        "variant": name,
        "sets": sets,
        "val_loss": finish["val_loss"],
        "final_train_loss": finish["final_loss"],
        "val_history": evals,
        "train_losses": losses,
        "forward_bytes_per_token": finish["forward_bytes_per_token"],
        "backward_bytes_per_token": finish["backward_bytes_per_token"],
        "tokens_per_second": finish["tokens_per_second"],
        "wall_seconds": time.time() - started,
    }


def codecs(agora, config, steps, out, extra, d, families):
    variants = [("float32", "float32", ["pipeline.codec=float32"])]
    if "bfloat16" in families:
        variants.append(("bfloat16", "bfloat16", ["pipeline.codec=bfloat16"]))
    if "int8" in families:
        variants.append(("int8", "int8", ["pipeline.codec=int8"]))
    for denominator in (4, 8, 16, 32) if "subspace" in families else ():
        k = max(1, d // denominator)
        variants.append((f"subspace 1/{denominator} (k={k})", f"subspace_{k}",
                         ["pipeline.codec=subspace", f"pipeline.subspace_rank={k}"]))
    for denominator in (4, 8, 16) if "columns" in families else ():
        variants.append((f"columns 1/{denominator} (k={round(d / denominator)})",
                         f"columns_{denominator}",
                         ["pipeline.codec=columns", f"pipeline.columns_kept={1 / denominator}"]))
    results = []
    for label, directory, sets in variants:
        print(f"  {label} ...", file=sys.stderr, flush=True)
        results.append(run_variant(agora, config, directory, extra + sets, steps, out)
                       | {"label": label})
    base = results[0]["val_loss"]
    print(f"\nBoundary codecs, gpipe, {steps} steps ({config}):\n")
    print("| codec | forward B/token | backward B/token | vs float32 | final val loss | vs float32 |")
    print("|---|---|---|---|---|---|")
    for r in results:
        r["val_ratio"] = r["val_loss"] / base
        r["bytes_ratio"] = (r["forward_bytes_per_token"] + r["backward_bytes_per_token"]) / (
            results[0]["forward_bytes_per_token"] + results[0]["backward_bytes_per_token"])
        print(f"| {r['label']} | {r['forward_bytes_per_token']:.1f} | "
              f"{r['backward_bytes_per_token']:.1f} | {r['bytes_ratio']:.4f} | "
              f"{r['val_loss']:.4f} | {r['val_ratio']:.4f} |")
    within = [r for r in results if r["val_ratio"] <= 1.03]
    best = min(within, key=lambda r: r["bytes_ratio"])
    print(f"\nlargest compression within 3% of float32's final val loss: {best['label']} "
          f"({1 / best['bytes_ratio']:.1f}x fewer bytes, val loss x{best['val_ratio']:.4f})")
    return results


def schedules(agora, config, steps, out, extra):
    variants = [("sync AdamW (gpipe)", ["pipeline.schedule=gpipe", "pipeline.optimizer=adamw"]),
                ("async AdamW", ["pipeline.schedule=async", "pipeline.optimizer=adamw"]),
                ("async NAdam(0.99)", ["pipeline.schedule=async", "pipeline.optimizer=nadam"])]
    results = []
    for i, (name, sets) in enumerate(variants):
        print(f"  {name} ...", file=sys.stderr, flush=True)
        results.append(run_variant(agora, config, f"schedule_{i}", extra + sets, steps, out)
                       | {"label": name})
    print(f"\nSchedules, float32 boundaries, {steps} steps ({config}):\n")
    print("| schedule | final val loss | vs sync AdamW | final train loss |")
    print("|---|---|---|---|")
    base = results[0]["val_loss"]
    for r in results:
        r["val_ratio"] = r["val_loss"] / base
        print(f"| {r['label']} | {r['val_loss']:.4f} | {r['val_ratio']:.4f} | "
              f"{r['final_train_loss']:.4f} |")
    return results


def layouts():
    # (name, d, layers, seq_len). Bytes per token per boundary from the wire format alone
    # (pipeline/boundary_codec.h): f32 4 d, bf16 2 d, int8 d + 4 ceil(d / 64) / ... per token
    # (a 64-value block's f32 scale), subspace 4 k (+ a 4-byte token id forward).
    geometries = [("1b", 2048), ("40B-class (d = 8192)", 8192)]
    rows = []
    for name, d in geometries:
        entry = {"geometry": name, "hidden_size": d,
                 "float32": 4 * d, "bfloat16": 2 * d, "int8": d + 4 * d / 64}
        for denominator in (4, 8, 16, 32, 100):
            k = d // denominator
            entry[f"subspace_1/{denominator}"] = {"k": k, "forward": 4 * k + 4, "backward": 4 * k}
        rows.append(entry)
    print("\nBytes per token per boundary, forward (backward is the same but subspace's 4-byte id):\n")
    print("| geometry | float32 | bfloat16 | int8 | subspace 1/4 | 1/8 | 1/16 | 1/32 | 1/100 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for e in rows:
        subs = " | ".join(f"{e[f'subspace_1/{x}']['forward']:,}" for x in (4, 8, 16, 32, 100))
        print(f"| {e['geometry']} | {e['float32']:,} | {e['bfloat16']:,} | {e['int8']:,.0f} | "
              f"{subs} |")
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_rss(proc):
    """Waits for `proc` and returns (exit code, peak RSS in bytes) from wait4."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024


def run_processes(agora, config, name, sets, steps, out, link, stages, pin):
    work = os.path.join(out, name)
    os.makedirs(work, exist_ok=True)
    keys = []
    for i in range(stages):
        key = os.path.join(work, f"stage-{i}.key")
        keys.append(subprocess.run([agora, "keygen", "--out", key], check=True,
                                   capture_output=True, text=True).stdout.strip())
    ports = [free_port() for _ in range(stages)]
    link_ports = [free_port() for _ in range(stages)]
    links, procs = [], []
    for i in range(1, stages):
        links.append(subprocess.Popen(
            [agora, "link", "--listen", str(link_ports[i]), "--to", f"127.0.0.1:{ports[i]}",
             "--profile", link, "--reverse-profile", link],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    all_sets = [f"train.steps={steps}", *sets]
    for i in reversed(range(stages)):
        args = [agora, "stage", "--config", config, "--stage", str(i), "--key",
                os.path.join(work, f"stage-{i}.key"), "--events",
                os.path.join(work, f"stage-{i}.jsonl"), "--quiet", "--timeout", "120"]
        if i > 0:
            args += ["--listen", f"tcp://127.0.0.1:{ports[i]}", "--prev-key", keys[i - 1]]
        if i < stages - 1:
            args += ["--next", f"tcp://127.0.0.1:{link_ports[i + 1]}", "--next-key", keys[i + 1]]
        for s in all_sets:
            args += ["--set", s]
        if pin:
            args = ["taskset", "-c", str(i % os.cpu_count())] + args
        procs.insert(0, subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=open(os.path.join(work, f"stage-{i}.log"), "w")))
    rss = []
    for i, p in enumerate(procs):
        code, peak = wait_rss(p)
        if code != 0:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            sys.exit(f"{name}: stage {i} failed ({code}); see {work}/stage-{i}.log")
        rss.append(peak)
    for l in links:
        l.terminate()
        l.wait()
    last = [json.loads(x) for x in open(os.path.join(work, f"stage-{stages - 1}.jsonl"))]
    return {"rss": rss, "events": last}


def processes(agora, config, steps, out, extra, link, skip, stages, pin):
    variants = [("sync AdamW (gpipe)", "proc_sync", ["pipeline.schedule=gpipe",
                                                     "pipeline.optimizer=adamw"]),
                ("async NAdam(0.99)", "proc_async", ["pipeline.schedule=async",
                                                     "pipeline.optimizer=nadam"])]
    results = []
    for label, directory, sets in variants:
        print(f"  {label}, {stages} processes over {link} ...", file=sys.stderr, flush=True)
        started = time.time()
        r = run_processes(agora, config, directory, extra + [f"pipeline.stages={stages}"] + sets,
                          steps, out, link, stages, pin)
        steps_ev = [e for e in r["events"] if e["event"] == "step"]
        start = next(e for e in r["events"] if e["event"] == "start")
        finish = next(e for e in r["events"] if e["event"] == "finish")
        # tokens/s over the steps after --skip, by the last stage's clock (it finishes every
        # step): the pipeline's fill and the processes' start-up left out.
        span = steps_ev[-1]["elapsed"] - steps_ev[skip - 1]["elapsed"]
        tokens_per_second = start["tokens_per_step"] * (len(steps_ev) - skip) / span
        results.append({"label": label, "rss": r["rss"], "losses": [e["loss"] for e in steps_ev],
                        "tokens_per_second": tokens_per_second, "seconds": finish["seconds"],
                        "wall_seconds": time.time() - started})
    # The whole model in one process: the local trainer with the same model and optimizer.
    whole_dir = os.path.join(out, "proc_whole")
    proc = subprocess.Popen([agora, "train", "--config", config, "--quiet",
                             "--set", "pipeline.stages=1", "--set", "pipeline.micro_batches=1",
                             "--set", "optimizer.name=adamw", "--set", f"train.steps={steps}",
                             "--set", f"train.out_dir={whole_dir}", *sum((["--set", s] for s in extra), [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    code, whole_rss = wait_rss(proc)
    if code != 0:
        sys.exit(f"the whole-model run failed ({code}): {proc.stderr.read()[-2000:]}")
    return {"stages": stages, "pinned": pin, "link": link, "variants": results,
            "whole_rss": whole_rss}


def plot(out, series, name, title):
    csv = os.path.join(out, f"{name}.csv")
    with open(csv, "w") as f:
        for i, r in enumerate(series):
            f.write(f"# {r['label']}\n")
            for step, loss in r["val_history"]:
                f.write(f"{step} {loss}\n")
            f.write("\n\n")
    lines = ", ".join(f"'{csv}' index {i} with linespoints title '{r['label']}'"
                      for i, r in enumerate(series))
    script = (f"set terminal pngcairo size 1000,640 font ',11'\nset output '{out}/{name}.png'\n"
              f"set title '{title}'\nset xlabel 'step'\nset ylabel 'validation loss'\n"
              f"set key top right\nset grid\nplot {lines}\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("warning: gnuplot failed (is gnuplot-nox installed?); CSV kept", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agora", default="build/apps/agora/agora")
    parser.add_argument("--config", default="configs/pipeline.toml")
    parser.add_argument("--scenario", default="all",
                        choices=["codecs", "schedules", "layouts", "processes", "all"])
    parser.add_argument("--link", default="rate=80mbit,delay=50ms",
                        help="processes: each boundary's link, each way (agora link --profile)")
    parser.add_argument("--process-steps", type=int, default=40, help="processes: steps per run")
    parser.add_argument("--process-stages", type=int, default=4, help="processes: S")
    parser.add_argument("--pin", action="store_true",
                        help="processes: stage i on core i mod cores (taskset), so that with S "
                             "no larger than the cores every stage has a core of its own")
    parser.add_argument("--skip", type=int, default=8,
                        help="processes: steps left out of tokens/s (start-up, pipeline fill)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--hidden-size", type=int, default=288, help="the config's model width")
    parser.add_argument("--families", default="float32,bfloat16,int8,subspace,columns",
                        help="codecs: which codec families run (float32 always)")
    parser.add_argument("--out", default="out/bench/pipeline")
    parser.add_argument("--json")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"config": args.config, "steps": args.steps, "sets": args.sets}
    if args.scenario in ("layouts", "all"):
        report["layouts"] = layouts()
    if args.scenario in ("codecs", "all"):
        report["codecs"] = codecs(args.agora, args.config, args.steps, args.out, args.sets,
                                  args.hidden_size, args.families.split(","))
        plot(args.out, report["codecs"], "pipeline_codecs",
             f"S = 4 gpipe, boundary codecs ({args.steps} steps)")
    if args.scenario in ("schedules", "all"):
        report["schedules"] = schedules(args.agora, args.config, args.steps, args.out, args.sets)
        plot(args.out, report["schedules"], "pipeline_schedules",
             f"S = 4, synchronous against asynchronous ({args.steps} steps)")
    if args.scenario in ("processes", "all"):
        p = processes(args.agora, args.config, args.process_steps, args.out, args.sets, args.link,
                      args.skip, args.process_stages, args.pin)
        report["processes"] = p
        print(f"\n{p['stages']} stage processes{' (pinned)' if p['pinned'] else ''} over "
              f"{p['link']} each way, {args.process_steps} steps, tokens/s from step "
              f"{args.skip}:\n")
        print("| schedule | tokens/s | vs sync | final train loss | peak RSS per stage (MiB) |")
        print("|---|---|---|---|---|")
        base = p["variants"][0]["tokens_per_second"]
        for v in p["variants"]:
            rss = " / ".join(f"{r / 2**20:.0f}" for r in v["rss"])
            print(f"| {v['label']} | {v['tokens_per_second']:.0f} | "
                  f"{v['tokens_per_second'] / base:.2f} | {v['losses'][-1]:.4f} | {rss} |")
        print(f"\nthe whole model in one process (agora train, AdamW): peak RSS "
              f"{p['whole_rss'] / 2**20:.0f} MiB")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"\nplots and CSV in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
