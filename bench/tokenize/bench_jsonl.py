#!/usr/bin/env python3
"""agora tokenize on JSON Lines (plain, gzip, Zstandard) against the same texts as plain files.

    bench_jsonl.py --agora build/apps/agora/agora [--corpus data/corpus] [--copies 4]
                   [--repeats 5] [--threads 0] [--tokenizer gpt2] [--json out/bench/jsonl.json]

The corpus's documents (every file under --corpus, --copies times over, so that the command's
start-up, about 0.7 s of loading libtorch, is a small part of each time) are written four ways: one plain file per
document, one .jsonl file (an object per line, the text under "text" beside an "id"), and that
file gzip- and Zstandard-compressed (Python's gzip at level 6, the zstd command at level 3, the
tools' defaults). Each is tokenized --repeats times, the four interleaved in every round so that
machine noise falls on all of them alike. The table gives the median MB/s of text (10^6 bytes of
the documents, not of the files) over the tokenizing itself (the "seconds" of `agora tokenize
--json`: listing, reading, decompressing, parsing, tokenizing and writing, without the process's
start-up and the tokenizer's loading, the same for every form) and over the whole command, their
ratios to the plain files', and checks that every form wrote the same shards byte for byte (it
fails loudly if not).
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def documents(corpus):
    """Every file under `corpus`, in the order agora lists a folder (sorted paths)."""
    paths = []
    for root, dirs, files in os.walk(corpus):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        paths += [os.path.join(root, f) for f in files if not f.startswith(".")]
    paths.sort(key=lambda p: os.path.relpath(p, corpus).split(os.sep))
    return paths


def shard_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder)) if name.endswith(".bin")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agora", required=True)
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "../../data/corpus"))
    ap.add_argument("--copies", type=int, default=4, help="the corpus this many times over")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="agora tokenize --threads (0: every core)")
    ap.add_argument("--tokenizer", default="gpt2")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.repeats < 1 or args.copies < 1:
        sys.exit("--repeats and --copies must be at least 1")
    if not shutil.which("zstd"):
        sys.exit("the zstd command is missing: run scripts/setup.sh")
    paths = documents(args.corpus) * args.copies
    if not paths:
        sys.exit(f"no documents under {args.corpus}: run scripts/setup.sh, or pass --corpus DIR")

    work = tempfile.mkdtemp(prefix="agora-bench-jsonl-")
    try:
        files = os.path.join(work, "files")
        os.makedirs(files)
        lines, text_bytes = [], 0
        for i, path in enumerate(paths):
            raw = open(path, "rb").read()
            text = raw.decode("utf-8", errors="replace")
            data = text.encode("utf-8")  # what the JSON holds, so both forms hold the same bytes
            text_bytes += len(data)
            with open(os.path.join(files, f"{i:06d}.txt"), "wb") as f:
                f.write(data)
            lines.append(json.dumps({"id": f"{i}:{os.path.relpath(path, args.corpus)}", "text": text},
                                    ensure_ascii=False))
        jsonl = ("\n".join(lines) + "\n").encode("utf-8")
        forms = {"files": files}
        for name, data in [("jsonl", jsonl), ("jsonl.gz", gzip.compress(jsonl, 6)),
                           ("jsonl.zst", subprocess.run(["zstd", "-q", "-3", "-c"], input=jsonl,
                                                        capture_output=True, check=True).stdout)]:
            forms[name] = os.path.join(work, f"corpus.{name}")
            with open(forms[name], "wb") as f:
                f.write(data)
        sizes = {name: (sum(os.path.getsize(os.path.join(files, x)) for x in os.listdir(files))
                        if name == "files" else os.path.getsize(path))
                 for name, path in forms.items()}

        seconds = {name: [] for name in forms}  # the tokenizing, from --json
        wall = {name: [] for name in forms}     # the whole command
        shards = {}
        for r in range(args.repeats):
            for name, path in forms.items():
                out = os.path.join(work, f"out-{name}")
                cmd = [args.agora, "tokenize", "--tokenizer", args.tokenizer, "--input", path,
                       "--out", out, "--force", "--threads", str(args.threads), "--json"]
                start = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, text=True)
                wall[name].append(time.perf_counter() - start)
                if done.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
                seconds[name].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
                if r == 0:
                    shards[name] = shard_bytes(out)
            print(f"round {r + 1}/{args.repeats}: " +
                  ", ".join(f"{n} {seconds[n][-1]:.2f} s" for n in forms), flush=True)

        same = {name: shards[name] == shards["files"] for name in forms}
        base = statistics.median(seconds["files"])
        base_wall = statistics.median(wall["files"])
        rows = []
        print(f"\n{len(paths)} documents ({args.copies} copies), {text_bytes / 1e6:.2f} MB of "
              f"text, tokenizer {args.tokenizer}, threads {args.threads or os.cpu_count()}, "
              f"median of {args.repeats} (MB/s of text over the tokenizing)")
        print(f"{'input':<12}{'file MB':>9}{'tokenize s':>12}{'MB/s':>8}{'min':>8}{'max':>8}"
              f"{'vs files':>10}{'command s':>11}{'vs files':>10}{'same shards':>13}")
        for name in forms:
            med = statistics.median(seconds[name])
            med_wall = statistics.median(wall[name])
            row = {"input": name, "file_mb": sizes[name] / 1e6, "seconds": seconds[name],
                   "median_seconds": med, "mb_per_s": text_bytes / 1e6 / med,
                   "mb_per_s_min": text_bytes / 1e6 / max(seconds[name]),
                   "mb_per_s_max": text_bytes / 1e6 / min(seconds[name]),
                   "ratio_to_files": base / med, "command_seconds": wall[name],
                   "median_command_seconds": med_wall,
                   "command_ratio_to_files": base_wall / med_wall, "same_shards": same[name]}
            rows.append(row)
            print(f"{name:<12}{row['file_mb']:>9.2f}{med:>12.3f}{row['mb_per_s']:>8.1f}"
                  f"{row['mb_per_s_min']:>8.1f}{row['mb_per_s_max']:>8.1f}"
                  f"{row['ratio_to_files']:>9.3f}x{med_wall:>11.2f}"
                  f"{row['command_ratio_to_files']:>9.3f}x{'yes' if same[name] else 'NO':>13}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"documents": len(paths), "copies": args.copies, "text_bytes": text_bytes,
                           "tokenizer": args.tokenizer, "threads": args.threads,
                           "repeats": args.repeats, "rows": rows}, f, indent=2)
        if not all(same.values()):
            sys.exit("FAIL: a form of the corpus gave other shards than the plain files")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
