#!/usr/bin/env python3
"""Cross-checks agora's DeMo against the independent reference in demo_reference.py.

usage:
  demo_parity_check.py CASE_DIR              check a case written by agora; exit 0 on agreement,
                                             1 with a report otherwise
  demo_parity_check.py --self-test           the test vectors of docs/algorithms.md §1.3 and more
  demo_parity_check.py --make-case DIR [--one-bit] [--seed N]
                                             write a case with the reference itself (to test this
                                             checker before, or besides, agora)

A case directory holds:
  case.json            {"beta", "topk", "chunk", "weight_decay", "one_bit", "steps": S, "peers": P,
                        "lr": [S floats], "tensors": [{"name", "shape"}, ...]}
  inputs.safetensors   F32: param.<name> (initial), grad.<step>.<peer>.<name> (already clipped)
  payload.<step>.<peer>.agp   the payload bytes peer p produced at step s
  outputs.safetensors  F32: param.<step>.<name> (after step s), delta.<step>.<peer>.<name>

Each step is checked from agora's own state after the previous step (so float noise cannot
compound and flip a later top-k):
  - contributions: the payload's positions (decoded by demo_reference.decode_payload) equal the
    reference's top-k per chunk as sets, except swaps among coefficients whose magnitudes agree to
    1e-5 relative (near-ties, counted); values within rtol 1e-5 / atol 1e-6 * the tensor's largest
    coefficient of the reference's coefficients at the payload's positions (one-bit: the payload's
    sign equals the sign rule applied to the reference value);
  - delta: within rtol 1e-4 / atol 1e-6 * max|beta * delta + lr * g| of the reference, the
    reference subtracting the coefficients at the payload's positions (so a near-tie cannot fail it);
  - parameters: the reference applies the payloads as decoded; every element equal exactly, except
    where |IDCT(aggregate)| <= 1e-6 * max|IDCT(aggregate)| of the tensor (the sign is ambiguous);
    such elements are counted, and at most 0.1% of a step's elements may differ.
The summary's worst/tol is the largest difference of a value or a delta over what is allowed.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_reference as ref  # noqa: E402

VALUE_RTOL, VALUE_ATOL = 1e-5, 1e-6  # atol relative to the tensor's largest coefficient
DELTA_RTOL, DELTA_ATOL = 1e-4, 1e-6  # atol relative to max |beta * delta + lr * g|
TIE_RTOL, TIE_FLOOR = 1e-5, 1e-6  # floor relative to the chunk's largest coefficient
SIGN_ZONE = 1e-6  # relative to max |IDCT(aggregate)| of the tensor
MAX_AMBIGUOUS_FRACTION = 1e-3

# ----------------------------------------------------------------------------------------------
# safetensors, F32 only


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[base + begin:base + end], dtype="<f4")
        out[name] = torch.from_numpy(array.reshape(info["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ----------------------------------------------------------------------------------------------
# A small payload encoder (dct_topk, f32 or one-bit values), for --make-case and the self-test


def encode_payload(step, tensors, chunk, one_bit):
    """tensors: [(shape, positions [chunks, k], values [chunks, k])], DeMo kind."""
    out = [b"AGPL", struct.pack("<HBBQI", 2, 1, 0, step, len(tensors))]
    for shape, positions, values in tensors:
        rows, cols = ref.chunk_geometry(shape, chunk)
        out.append(struct.pack("<BBBB", len(shape), 1, 3 if one_bit else 1, 0))
        out.append(struct.pack(f"<{len(shape)}I", *shape))
        out.append(struct.pack("<III", rows, cols, positions.shape[1]))
        out.append(ref.encode_positions(positions.numpy(), rows * cols, positions.shape[1]))
        values = values.numpy().reshape(-1)
        if one_bit:
            out.append(np.packbits(values < 0, bitorder="little").tobytes())
        else:
            out.append(values.astype("<f4").tobytes())
    return b"".join(out)


def payload_to_torch(decoded):
    return [(torch.from_numpy(t["positions"]), torch.from_numpy(t["values"]))
            for t in decoded["tensors"]]


# ----------------------------------------------------------------------------------------------
# --make-case


def make_case(out_dir, one_bit, seed, case=None):
    g = torch.Generator().manual_seed(seed)
    case = case or {"beta": 0.9, "topk": 3, "chunk": 16, "weight_decay": 0.1, "one_bit": one_bit,
            "steps": 4, "peers": 3, "lr": [0.05, 0.04, 0.03, 0.02],
            "tensors": [{"name": "embed", "shape": [48, 32]}, {"name": "norm", "shape": [40]},
                        {"name": "odd", "shape": [50, 7]}, {"name": "prime", "shape": [37]},
                        {"name": "stack", "shape": [2, 16, 24]}, {"name": "tiny", "shape": [3]}]}
    case["one_bit"] = one_bit
    shapes = [t["shape"] for t in case["tensors"]]
    names = [t["name"] for t in case["tensors"]]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    case.setdefault("max_norm_ratio", 1.0)
    make = lambda: ref.DeMo(case["beta"], case["topk"], case["chunk"], case["weight_decay"], one_bit,
                            case["max_norm_ratio"])
    params = [torch.randn(s, generator=g) * 0.1 for s in shapes]
    peers = [make() for _ in range(case["peers"])]
    inputs = {f"param.{n}": p.clone() for n, p in zip(names, params)}
    outputs = {}
    for s in range(case["steps"]):
        lr, payloads = case["lr"][s], []
        for p, peer in enumerate(peers):
            grads = [torch.randn(shape, generator=g) for shape in shapes]
            norm = math.sqrt(sum(float(x.pow(2).sum()) for x in grads))
            grads = [x * min(1.0, 1.0 / (norm + 1e-6)) for x in grads]  # local clipping to 1.0
            if s == 0 and p == 1:
                grads[-1].zero_()  # an all-zero tensor: every coefficient ties
            for n, x in zip(names, grads):
                inputs[f"grad.{s}.{p}.{n}"] = x
            contribution = peer.contribute(grads, lr)
            for n, d in zip(names, peer.delta):
                outputs[f"delta.{s}.{p}.{n}"] = d.clone()
            data = encode_payload(s, [(shape, pos, val) for shape, (pos, val)
                                      in zip(shapes, contribution)], case["chunk"], one_bit)
            with open(os.path.join(out_dir, f"payload.{s}.{p}.agp"), "wb") as f:
                f.write(data)
            payloads.append(payload_to_torch(ref.decode_payload(data)))
        make().apply(params, payloads, lr)  # apply holds no state: any instance will do
        for n, x in zip(names, params):
            outputs[f"param.{s}.{n}"] = x.clone()
    write_safetensors(os.path.join(out_dir, "inputs.safetensors"), inputs)
    write_safetensors(os.path.join(out_dir, "outputs.safetensors"), outputs)
    print(f"wrote {out_dir}: {case['steps']} steps, {case['peers']} peers, one_bit={one_bit}")


# ----------------------------------------------------------------------------------------------
# The comparisons


def compare_positions(X, mine, theirs):
    """Per chunk, the two position sets must be equal, or differ only among coefficients whose
    magnitudes agree to TIE_RTOL (+ TIE_FLOOR * the chunk's largest magnitude). Returns
    (near_tie_swaps, [descriptions of chunks that disagree])."""
    size = X.shape[1]
    mine_mask = torch.zeros(X.shape, dtype=torch.bool).scatter_(1, mine, True)
    their_mask = torch.zeros(X.shape, dtype=torch.bool).scatter_(1, theirs, True)
    differ = (mine_mask != their_mask).any(dim=1).nonzero().flatten().tolist()
    swaps, bad = 0, []
    for c in differ:
        mags = X[c].abs().double()
        only_mine, only_theirs = mine_mask[c] & ~their_mask[c], their_mask[c] & ~mine_mask[c]
        involved = mags[only_mine | only_theirs]
        spread = float(involved.max() - involved.min())
        if spread <= TIE_RTOL * float(involved.max()) + TIE_FLOOR * float(mags.max()):
            swaps += int(only_mine.sum())
        else:
            bad.append(f"chunk {c} of {X.shape[0]} (size {size}): reference selects "
                       f"{only_mine.nonzero().flatten().tolist()} "
                       f"|X|={[f'{v:.6g}' for v in mags[only_mine].tolist()]}, payload "
                       f"{only_theirs.nonzero().flatten().tolist()} "
                       f"|X|={[f'{v:.6g}' for v in mags[only_theirs].tolist()]}")
    return swaps, bad


def ulp_distance(a, b):
    ia = a.numpy().view(np.int32).astype(np.int64)
    ib = b.numpy().view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # sign-magnitude -> monotone integers
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max()) if ia.size else 0


def check_layout(decoded, case, names, shapes):
    problems = []
    if decoded["kind"] != "demo":
        problems.append(f"kind {decoded['kind']}, expected demo")
    if len(decoded["tensors"]) != len(names):
        return problems + [f"{len(decoded['tensors'])} tensors, expected {len(names)}"]
    want_type = ("one_bit",) if case["one_bit"] else ("f32", "bf16")
    for n, shape, t in zip(names, shapes, decoded["tensors"]):
        rows, cols = ref.chunk_geometry(shape, case["chunk"])
        want = {"shape": list(shape), "encoding": "dct_topk", "chunk_rows": rows,
                "chunk_cols": cols, "topk": min(case["topk"], rows * cols)}
        for key, value in want.items():
            if t.get(key) != value:
                problems.append(f"{n}: {key} {t.get(key)}, expected {value}")
        if t["value_type"] not in want_type:
            problems.append(f"{n}: value type {t['value_type']}, expected {' or '.join(want_type)}")
    return problems


def check_case(case_dir):
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    inputs = read_safetensors(os.path.join(case_dir, "inputs.safetensors"))
    outputs = read_safetensors(os.path.join(case_dir, "outputs.safetensors"))
    names = [t["name"] for t in case["tensors"]]
    shapes = [tuple(t["shape"]) for t in case["tensors"]]
    S, P, chunk = case["steps"], case["peers"], case["chunk"]
    beta, one_bit = case["beta"], case["one_bit"]
    demo = ref.DeMo(beta, case["topk"], chunk, case["weight_decay"], one_bit, case["max_norm_ratio"])
    failures = []

    def fail(where, what):
        failures.append(f"{where}: {what}")

    def get(store, key, shape):
        if key not in store:
            raise KeyError(key)
        if tuple(store[key].shape) != tuple(shape):
            raise ValueError(f"{key} has shape {list(store[key].shape)}, expected {list(shape)}")
        return store[key]

    print(f"case {case_dir}: beta {beta}, topk {case['topk']}, chunk {chunk}, "
          f"wd {case['weight_decay']}, one_bit {one_bit}, {S} steps, {P} peers, {len(names)} tensors")
    header = (f"{'step':>4} {'lr':>9} {'hdr step':>8} {'max|dval|':>10} {'near-ties':>9} "
              f"{'1bit-amb':>8} {'max|ddelta|':>11} {'max|dparam|':>11} {'amb-signs':>9} "
              f"{'elements':>9} {'worst/tol':>9}  result")
    print(header)
    previous_header_step = None
    for s in range(S):
        lr = case["lr"][s]
        n_fail = len(failures)
        stat = {"ratio": 0.0, "dval": 0.0, "ties": 0, "vamb": 0, "ddelta": 0.0, "dparam": 0.0, "amb": 0}
        payloads, header_steps = [], set()
        try:
            for p in range(P):
                where = f"step {s} peer {p}"
                with open(os.path.join(case_dir, f"payload.{s}.{p}.agp"), "rb") as f:
                    data = f.read()
                try:
                    decoded = ref.decode_payload(data)
                except ValueError as e:
                    fail(where, f"payload does not decode: {e}")
                    payloads = None
                    continue
                header_steps.add(decoded["step"])
                problems = check_layout(decoded, case, names, shapes)
                for problem in problems:
                    fail(where, f"payload layout: {problem}")
                if problems:
                    payloads = None
                    continue
                if payloads is not None:
                    payloads.append(payload_to_torch(decoded))
                for i, (n, shape) in enumerate(zip(names, shapes)):
                    where = f"step {s} peer {p} tensor {n}"
                    t = decoded["tensors"][i]
                    theirs = torch.from_numpy(t["positions"])
                    their_values = torch.from_numpy(t["values"])
                    previous = (torch.zeros(shape) if s == 0
                                else get(outputs, f"delta.{s - 1}.{p}.{n}", shape))
                    grad = get(inputs, f"grad.{s}.{p}.{n}", shape)
                    # 2-3: momentum and its coefficients, from agora's previous delta
                    momentum = previous.clone().mul_(beta).add_(grad, alpha=lr)
                    X = ref.encode(momentum, chunk)
                    mine, _ = ref.select_topk(X, case["topk"])
                    swaps, bad = compare_positions(X, mine, theirs)
                    stat["ties"] += swaps
                    for b in bad[:3]:
                        fail(where, f"positions differ: {b}")
                    if len(bad) > 3:
                        fail(where, f"positions differ in {len(bad) - 3} more chunks")
                    # values: the reference's coefficients at the payload's positions
                    at = X.gather(1, theirs)
                    scale = float(X.abs().max())
                    if t["value_type"] == "one_bit":
                        wrong = ref.one_bit(at) != their_values
                        near_zero = at.abs() <= VALUE_ATOL * scale
                        stat["vamb"] += int((wrong & near_zero).sum())
                        hard = wrong & ~near_zero
                        if hard.any():
                            c, k = hard.nonzero()[0].tolist()
                            fail(where, f"{int(hard.sum())} one-bit values with the wrong sign, "
                                        f"e.g. chunk {c} position {int(theirs[c, k])}: reference "
                                        f"{float(at[c, k]):.6g}, payload {float(their_values[c, k]):+g}")
                    else:
                        expected = at if t["value_type"] == "f32" else at.to(torch.bfloat16).float()
                        rtol = VALUE_RTOL if t["value_type"] == "f32" else 2.0 ** -8
                        diff = (their_values - expected).abs()
                        stat["dval"] = max(stat["dval"], float(diff.max()))
                        allowed = rtol * expected.abs() + VALUE_ATOL * scale
                        stat["ratio"] = max(stat["ratio"], float((diff / allowed).max()))
                        hard = diff > allowed
                        if hard.any():
                            c, k = hard.nonzero()[0].tolist()
                            fail(where, f"{int(hard.sum())} values differ, e.g. chunk {c} position "
                                        f"{int(theirs[c, k])}: reference {float(expected[c, k]):.9g}, "
                                        f"payload {float(their_values[c, k]):.9g} "
                                        f"(tensor scale {scale:.3g})")
                    # 4: the sent coefficients (unquantized) leave the momentum
                    sent = torch.zeros_like(X).scatter_(1, theirs, at)
                    delta_ref = momentum - ref.decode(sent, shape, chunk)
                    delta = get(outputs, f"delta.{s}.{p}.{n}", shape)
                    dscale = float(momentum.abs().max())
                    diff = (delta - delta_ref).abs()
                    stat["ddelta"] = max(stat["ddelta"], float(diff.max()))
                    allowed = DELTA_RTOL * delta_ref.abs() + DELTA_ATOL * dscale
                    stat["ratio"] = max(stat["ratio"], float((diff / allowed).max()))
                    hard = diff > allowed
                    if hard.any():
                        e = int(diff.flatten().argmax())
                        fail(where, f"delta: {int(hard.sum())} of {delta.numel()} elements differ, "
                                    f"worst flat index {e}: reference {float(delta_ref.flatten()[e]):.9g}, "
                                    f"agora {float(delta.flatten()[e]):.9g} (scale {dscale:.3g})")
            if len(header_steps) > 1:
                fail(f"step {s}", f"peers' payload headers disagree on the step: {sorted(header_steps)}")
            header_step = min(header_steps) if header_steps else None
            if (previous_header_step is not None and header_step is not None
                    and header_step != previous_header_step + 1):
                fail(f"step {s}", f"payload header step {header_step} does not follow "
                                  f"{previous_header_step}")
            previous_header_step = header_step
            # 1, 5-7: apply the payloads as decoded to agora's previous parameters
            elements, ambiguous = 0, 0
            if payloads is None:
                fail(f"step {s}", "parameters not checked: a payload did not decode")
            else:
                params = [(get(inputs, f"param.{n}", shape) if s == 0
                           else get(outputs, f"param.{s - 1}.{n}", shape)).clone()
                          for n, shape in zip(names, shapes)]
                updates = demo.apply(params, payloads, lr)
                for n, shape, mine_p, update in zip(names, shapes, params, updates):
                    where = f"step {s} tensor {n}"
                    theirs_p = get(outputs, f"param.{s}.{n}", shape)
                    elements += mine_p.numel()
                    stat["dparam"] = max(stat["dparam"], float((theirs_p - mine_p).abs().max()))
                    mismatch = theirs_p != mine_p
                    zone = update.abs() <= SIGN_ZONE * float(update.abs().max())
                    ambiguous += int((mismatch & zone).sum())
                    hard = mismatch & ~zone
                    if hard.any():
                        e = int(hard.flatten().nonzero()[0])
                        fail(where, f"parameters: {int(hard.sum())} of {mine_p.numel()} elements "
                                    f"differ where the sign is clear (max {ulp_distance(mine_p[hard], theirs_p[hard])} "
                                    f"ulp), e.g. flat index {e}: reference {float(mine_p.flatten()[e]):.9g}, "
                                    f"agora {float(theirs_p.flatten()[e]):.9g}, IDCT(aggregate) "
                                    f"{float(update.flatten()[e]):.3g}")
                stat["amb"] = ambiguous
                if ambiguous > MAX_AMBIGUOUS_FRACTION * elements:
                    fail(f"step {s}", f"{ambiguous} of {elements} parameters differ where the sign "
                                      f"is ambiguous (more than {MAX_AMBIGUOUS_FRACTION:.1%})")
        except (KeyError, ValueError, OSError) as e:
            fail(f"step {s}", f"missing or malformed data: {e}")
            elements = 0
            header_step = None
        result = "ok" if len(failures) == n_fail else f"FAIL ({len(failures) - n_fail})"
        print(f"{s:>4} {lr:>9.3g} {str(header_step):>8} {stat['dval']:>10.3g} {stat['ties']:>9} "
              f"{stat['vamb']:>8} {stat['ddelta']:>11.3g} {stat['dparam']:>11.3g} {stat['amb']:>9} "
              f"{elements:>9} {stat['ratio']:>9.2g}  {result}")
    if failures:
        print(f"\nDISAGREEMENT: {len(failures)} failures")
        for line in failures[:40]:
            print("  " + line)
        if len(failures) > 40:
            print(f"  ... and {len(failures) - 40} more")
        return False
    print("agreement: every step matches the reference")
    return True


# ----------------------------------------------------------------------------------------------
# --self-test


def self_test():
    failures = []

    def expect(ok, what):
        print(("  ok    " if ok else "  FAIL  ") + what)
        if not ok:
            failures.append(what)

    for (n, c), want in {(12, 5): 4, (100, 7): 5, (100, 26): 25, (100, 101): 100,
                         (50257, 64): 29, (50304, 64): 64}.items():
        expect(ref.chunk_size(n, c) == want, f"chunk_size({n}, {c}) = {ref.chunk_size(n, c)}, want {want}")

    CT = torch.tensor([[.5000, .6533, .5000, .2706], [.5000, .2706, -.5000, -.6533],
                       [.5000, -.2706, -.5000, .6533], [.5000, -.6533, .5000, -.2706]])
    expect(torch.allclose(ref.dct_matrix(4).T, CT, atol=5e-5), "DCT matrix n=4 (as C^T)")
    for n in (1, 4, 29, 64, 100):
        C = ref.dct_matrix(n)
        expect(torch.allclose(C @ C.T, torch.eye(n), atol=1e-5), f"C C^T = I for n={n}")

    X = ref.encode(torch.arange(8, dtype=torch.float32), 64)
    want = torch.tensor([[9.8995, -6.4423, 0, -0.67345, 0, -0.2009, 0, -0.0507]])
    expect(X.shape == (1, 8) and torch.allclose(X, want, atol=5e-4), f"encode [0..7] = {X.tolist()}")

    positions, values = ref.select_topk(torch.tensor([[0.1911, 0.4076, 0.1649, 0.8059]]), 2)
    expect(positions.tolist() == [[1, 3]] and torch.allclose(values, torch.tensor([[0.4076, 0.8059]])),
           "top-2 of [0.1911, 0.4076, 0.1649, 0.8059] -> positions {1, 3}")

    g = torch.Generator().manual_seed(1)
    for shape, chunk in [((100,), 7), ((37,), 16), ((64, 64), 64), ((48, 30), 16), ((3, 20, 24), 8),
                         ((2, 3, 12, 10), 4), ((1, 50), 64)]:
        x = torch.randn(shape, generator=g)
        X = ref.encode(x, chunk)
        rows, cols = ref.chunk_geometry(shape, chunk)
        back = ref.decode(X, shape, chunk)
        expect(X.shape == (x.numel() // (rows * cols), rows * cols) and torch.allclose(back, x, atol=1e-5),
               f"decode(encode(x)) = x for {list(shape)} chunk {chunk}")
    # block order and orientation, against a direct float64 computation
    x = torch.randn(2, 8, 12, generator=g)
    X = ref.encode(x, 4)  # blocks 4x4, [2, 2, 3] of them
    C = ref.dct_matrix(4).double()
    block = x[1, 4:8, 8:12].double()
    expect(torch.allclose(X[1 * 6 + 1 * 3 + 2].double(), (C @ block @ C.T).reshape(-1), atol=1e-5),
           "chunk (batch 1, block row 1, block col 2) is chunk 11, B -> C B C^T row-major")

    agg = ref.aggregate([(torch.tensor([[0, 2]]), torch.tensor([[1.0, 3.0]])),
                         (torch.tensor([[2, 3]]), torch.tensor([[5.0, -2.0]]))], 1, 4, False)
    expect(agg.tolist() == [[1.0, 0.0, 4.0, -2.0]], f"aggregate A{{0:1,2:3}} + B{{2:5,3:-2}} = {agg.tolist()}")
    agg = ref.aggregate([(torch.tensor([[0, 2]]), torch.tensor([[1.0, 3.0]])),
                         (torch.tensor([[2, 3]]), torch.tensor([[-5.0, 0.0]]))], 1, 4, True)
    expect(agg.tolist() == [[1.0, 0.0, 0.0, 1.0]], f"one-bit aggregate (+0 -> +1) = {agg.tolist()}")

    # bounded influence: norms 1, 2 and 10, lower median 2; at ratio 1 only the third is scaled,
    # to norm 2; ratio 0 changes nothing
    one = [(torch.tensor([[0]]), torch.tensor([[v]])) for v in (1.0, -2.0, 10.0)]
    bounded = [values.item() for _, values in ref.bound_influence(one, 1.0)]
    expect(bounded == [1.0, -2.0, 2.0], f"bound_influence at ratio 1: {bounded}")
    kept = [values.item() for _, values in ref.bound_influence(one, 0.0)]
    expect(kept == [1.0, -2.0, 10.0], f"bound_influence at ratio 0: {kept}")

    # apply: weight decay, then -lr * sign(IDCT(mean)); sign(0) = 0 leaves an element alone
    demo = ref.DeMo(topk=1, chunk=4, weight_decay=0.5)
    p = [torch.ones(4)]
    demo.apply(p, [[(torch.tensor([[1]]), torch.tensor([[2.0]]))]], 0.25)
    want = 0.875 - 0.25 * torch.sign(ref.dct_matrix(4)[1])
    expect(torch.equal(p[0], want), f"apply on ones: {p[0].tolist()}")
    p = [torch.ones(4)]
    demo.apply(p, [[(torch.tensor([[1]]), torch.tensor([[2.0]]))],
                   [(torch.tensor([[1]]), torch.tensor([[-2.0]]))]], 0.25)
    expect(torch.equal(p[0], torch.full((4,), 0.875)), "apply with a zero aggregate only decays")

    # contribute: what is sent plus what stays is the momentum
    demo = ref.DeMo(beta=0.5, topk=3, chunk=8)
    grads = [torch.randn(16, 24, generator=g), torch.randn(10, generator=g)]
    payload = demo.contribute(grads, 0.1)
    for (pos, val), grad, delta in zip(payload, grads, demo.delta):
        sent = ref.decode(torch.zeros(ref.encode(grad, 8).shape).scatter_(1, pos, val), grad.shape, 8)
        expect(torch.allclose(sent + delta, 0.1 * grad, atol=1e-6) and pos.shape[1] == 3
               and bool((pos.diff(dim=1) > 0).all()), f"contribute: sent + delta = lr g, {list(grad.shape)}")

    # the wire format round trip, f32 and one-bit
    for one_bit in (False, True):
        tensors = [((300,), torch.tensor([[0, 7, 99], [1, 2, 3], [4, 50, 99]]),
                    torch.tensor([[1.5, -0.0, 2.0], [-1.0, 3.0, 0.25], [0.0, -7.0, 1.0]])),
                   ((64, 64), torch.tensor([[0, 4095]]), torch.tensor([[-1.0, 2.0]]))]
        data = encode_payload(7, tensors, 100, one_bit)
        d = ref.decode_payload(data)
        ok = d["kind"] == "demo" and d["step"] == 7 and len(d["tensors"]) == 2
        for (shape, pos, val), t in zip(tensors, d["tensors"]):
            want_values = ref.one_bit(val) if one_bit else val
            ok &= (t["shape"] == list(shape) and np.array_equal(t["positions"], pos.numpy())
                   and np.array_equal(t["values"], want_values.numpy()))
        expect(ok, f"payload round trip, one_bit={one_bit} ({len(data)} bytes)")
    expect(len(encode_payload(0, [((64, 64), torch.zeros(1, 4, dtype=torch.long) + torch.arange(4),
                                   torch.ones(1, 4))], 64, True)) == 20 + 4 + 8 + 12 + 6 + 1,
           "one-bit 64x64 topk 4: a 44-bit rank in 6 bytes, 1 byte of bits")
    for bad, what in [(b"AGPX" + data[4:], "bad magic"), (data[:-1], "truncated"), (data + b"\0", "trailing")]:
        try:
            ref.decode_payload(bad)
            expect(False, f"decode_payload rejects {what}")
        except ValueError:
            expect(True, f"decode_payload rejects {what}")

    # the near-tie rule
    X = torch.tensor([[1.0, 0.5, 0.5 * (1 + 1e-7), 0.1], [1.0, 0.5, 0.49, 0.1]])
    swaps, bad = compare_positions(X, torch.tensor([[0, 2], [0, 1]]), torch.tensor([[0, 1], [0, 2]]))
    expect(swaps == 1 and len(bad) == 1, f"near-ties: one tolerated swap, one real difference ({swaps}, {len(bad)})")

    print("self-test: " + ("all passed" if not failures else f"{len(failures)} FAILED"))
    return not failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case_dir", nargs="?")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--make-case", metavar="DIR")
    parser.add_argument("--one-bit", action="store_true", help="with --make-case")
    parser.add_argument("--seed", type=int, default=0, help="with --make-case")
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic and light; the cases are small
    if args.self_test:
        return 0 if self_test() else 1
    if args.make_case:
        make_case(args.make_case, args.one_bit, args.seed)
        return 0
    if not args.case_dir:
        parser.error("give CASE_DIR, --self-test or --make-case DIR")
    return 0 if check_case(args.case_dir) else 1


if __name__ == "__main__":
    sys.exit(main())
