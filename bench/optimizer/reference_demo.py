#!/usr/bin/env python3
"""The Python side of the optimizer benchmark: DeMo in plain PyTorch (tests/parity/demo_reference.py)
timed on random float32 parameters and gradients, with torch.optim.AdamW for reference.

usage: reference_demo.py --shapes SHAPES.json --topk K --chunk C --one-bit 0|1 --peers 1,4,16,100,1000
                         --repeats R --threads N --json OUT.json

SHAPES.json is a list of {"name", "shape"}. Timings (time.perf_counter, median over R repeats
after one warm-up):
  compress      steps 2-4 for every tensor: momentum, chunked DCT, top-k, own decode subtraction
  aggregate_P   steps 1 and 5-7 with P payloads (this peer's and P-1 random ones made in advance,
                positions repeating beyond 15 of them):
                weight decay, mean aggregation, inverse DCT, sign step
  adamw         one torch.optim.AdamW step over the same parameters, gradients set
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
import demo_reference as ref  # noqa: E402

BETA, WEIGHT_DECAY, LR = 0.999, 0.1, 1e-3
POSITION_SETS = 15  # distinct random position sets among the other peers


def median_time(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--topk", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--one-bit", type=int, choices=(0, 1), default=0)
    parser.add_argument("--peers", default="1,4,16,100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peer_counts = [int(p) for p in args.peers.split(",") if p]

    with open(args.shapes) as f:
        shapes = [tuple(t["shape"]) for t in json.load(f)]
    g = torch.Generator().manual_seed(args.seed)
    params = [torch.randn(s, generator=g) * 0.02 for s in shapes]
    grads = [torch.randn(s, generator=g) * 1e-3 for s in shapes]
    demo = ref.DeMo(BETA, args.topk, args.chunk, WEIGHT_DECAY, bool(args.one_bit))

    results = {}
    with torch.no_grad():
        results["compress"] = median_time(lambda: demo.contribute(grads, LR), args.repeats)

        # Payloads of the other peers, made in advance (not timed). Drawing positions costs a
        # top-k over every coefficient, so beyond POSITION_SETS peers the positions repeat (with
        # fresh values): a scatter costs the same whichever positions it writes.
        own = demo.contribute(grads, LR)
        extras, position_sets = [], []
        for j in range(max(peer_counts) - 1):
            if j < POSITION_SETS:
                sets = []
                for shape, (positions, _) in zip(shapes, own):
                    rows, cols = ref.chunk_geometry(shape, args.chunk)
                    chunks, k = positions.shape
                    scores = torch.rand(chunks, rows * cols, generator=g)
                    sets.append(scores.topk(k, dim=1).indices.sort(dim=1).values)
                position_sets.append(sets)
            payload = []
            for random_positions, (positions, values) in zip(position_sets[j % POSITION_SETS], own):
                chunks, k = positions.shape
                if args.one_bit:
                    random_values = torch.randint(0, 2, (chunks, k), generator=g).float() * 2 - 1
                else:
                    random_values = torch.randn(chunks, k, generator=g) * values.abs().mean()
                payload.append((random_positions, random_values))
            extras.append(payload)
        for peers in peer_counts:
            payloads = [own] + extras[:peers - 1]
            results[f"aggregate_{peers}"] = median_time(lambda: demo.apply(params, payloads, LR),
                                                        args.repeats)

    adamw_params = [p.clone() for p in params]
    for p, grad in zip(adamw_params, grads):
        p.grad = grad.clone()
    adamw = torch.optim.AdamW(adamw_params, lr=LR, weight_decay=WEIGHT_DECAY)
    results["adamw"] = median_time(adamw.step, args.repeats)

    numel = sum(p.numel() for p in params)
    report = {"threads": args.threads, "median_seconds": results, "repeats": args.repeats,
              "torch_version": torch.__version__, "parameters": numel, "topk": args.topk,
              "chunk": args.chunk, "one_bit": bool(args.one_bit)}
    print(f"DeMo reference (PyTorch {torch.__version__}, {args.threads} threads): {len(shapes)} tensors, "
          f"{numel} parameters, topk {args.topk}, chunk {args.chunk}, one_bit {bool(args.one_bit)}")
    for name, seconds in results.items():
        print(f"  {name:<14} {seconds * 1e3:>10.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
