#!/usr/bin/env python3
"""What the output head and its cross-entropy cost at the demo's shape, and what fusing could save.

    /usr/bin/python3 bench/trainer/head_cost.py [--tokens 1024] [--dim 64] [--vocab 8192]
                                                [--threads 2] [--repeats 30] [--json FILE]

Issue 43 asks for agora's trainer at 1.5x Python's tokens/s (given the same malloc settings) and
suggests a fused, chunked cross-entropy over the 8192-wide head. Before building it, this measures
the bound: one micro-batch of the demo (tiny:32x128/8: 8 x 128 = 1024 tokens, hidden size 64,
vocabulary 8192, tied head), forward and backward, in Debian's python3-torch (the same libtorch
as agora), each part alone:

  head + cross-entropy   logits = h W^T, mean cross-entropy in float32, backward to h and W
  head matmuls only      the same three matmuls (forward, grad of h, grad of W), no softmax
  cross-entropy alone    cross_entropy forward + backward on ready logits [tokens, vocab]
  chunked, C rows        logits, log-sum-exp and the gradient C rows at a time (an autograd
                         Function, recomputing each chunk's logits in backward): the logits are
                         never whole, which is what a fused kernel would do

The cross-entropy's share is what any fusion could save at most: it still has to exponentiate
every logit. Run it with agora's malloc settings in the environment (bench_trainer's
"Python + agora's malloc settings"; the script sets them itself and re-executes when they are
missing) so that the allocator is not what is measured. Prints a table of medians and, with
--json, writes them.
"""
import argparse
import json
import os
import statistics
import sys
import time

# agora's glibc malloc settings (src/agora/core/allocator.cc), as bench_trainer passes them.
MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
          "MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_TOP_PAD_": str(64 << 20)}
if any(os.environ.get(k) != v for k, v in MALLOC.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **MALLOC})

import torch  # noqa: E402  (after the re-exec: malloc reads its settings at start)
import torch.nn.functional as F  # noqa: E402


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of h W^T against targets, `chunk` rows at a time."""

    @staticmethod
    def forward(ctx, h, w, targets, chunk):
        n = h.size(0)
        lse = torch.empty(n)
        total = torch.zeros(())
        for s in range(0, n, chunk):
            logits = h[s:s + chunk] @ w.t()
            lse[s:s + chunk] = torch.logsumexp(logits, 1)
            total += (lse[s:s + chunk] - logits.gather(1, targets[s:s + chunk, None])[:, 0]).sum()
        ctx.save_for_backward(h, w, targets, lse)
        ctx.chunk = chunk
        return total / n

    @staticmethod
    def backward(ctx, grad):
        h, w, targets, lse = ctx.saved_tensors
        n, chunk = h.size(0), ctx.chunk
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(w)
        for s in range(0, n, chunk):
            p = torch.exp(h[s:s + chunk] @ w.t() - lse[s:s + chunk, None])
            p[torch.arange(p.size(0)), targets[s:s + chunk]] -= 1
            p *= grad / n
            grad_h[s:s + chunk] = p @ w
            grad_w.addmm_(p.t(), h[s:s + chunk])
        return grad_h, grad_w, None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="rows of the micro-batch (8 x 128)")
    ap.add_argument("--dim", type=int, default=64, help="hidden size (tiny: 64)")
    ap.add_argument("--vocab", type=int, default=8192, help="padded vocabulary (sp8k: 8192)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--chunks", default="128,256", help="comma-separated row counts")
    ap.add_argument("--json", help="write the medians here")
    a = ap.parse_args()
    for name in ("tokens", "dim", "vocab", "threads", "repeats"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1 (it is {getattr(a, name)})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    h = torch.randn(a.tokens, a.dim, requires_grad=True)
    w = (torch.randn(a.vocab, a.dim) * 0.02).requires_grad_()
    targets = torch.randint(0, a.vocab, (a.tokens,))
    ready = (h @ w.t()).detach().requires_grad_()

    def head_and_loss():
        F.cross_entropy((h @ w.t()).float(), targets).backward()

    def matmuls_only():
        logits = h @ w.t()
        logits.backward(torch.full_like(logits, 1e-4))

    def loss_only():
        F.cross_entropy(ready, targets).backward()

    def chunked(c):
        return lambda: ChunkedCrossEntropy.apply(h, w, targets, c).backward()

    def median_seconds(f):
        samples = []
        for i in range(a.repeats + 3):
            h.grad = w.grad = ready.grad = None
            start = time.perf_counter()
            f()
            if i >= 3:  # three warm-ups
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    rows = [("head + cross-entropy", median_seconds(head_and_loss)),
            ("head matmuls only", median_seconds(matmuls_only)),
            ("cross-entropy alone", median_seconds(loss_only))]
    for c in [int(x) for x in a.chunks.split(",") if x]:
        rows.append((f"chunked, {c} rows", median_seconds(chunked(c))))
    base = rows[0][1]
    print(f"head_cost: {a.tokens} tokens x {a.dim} -> {a.vocab}, {a.threads} threads, "
          f"median of {a.repeats}, agora's malloc settings")
    print(f"{'part (forward + backward)':<28}{'ms':>9}{'of head + loss':>16}")
    for name, s in rows:
        print(f"{name:<28}{s * 1e3:>9.2f}{s / base:>15.0%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "head_cost", "tokens": a.tokens, "dim": a.dim,
                       "vocab": a.vocab, "threads": a.threads, "repeats": a.repeats,
                       "median_seconds": {name: s for name, s in rows}}, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
