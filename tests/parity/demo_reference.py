"""DeMo (Decoupled Momentum), an independent reference written from the specification alone
(docs/algorithms.md §1).

Read it next to the paper (arXiv 2411.19870). One step on one peer, per parameter tensor p with
local gradient g:

    1. p     <- p * (1 - lr * wd)                       decoupled weight decay, first
    2. delta <- beta * delta + lr * g                    the learning rate folded into the momentum
    3. X     <- DCT_chunked(delta); per chunk keep the topk coefficients of largest magnitude
    4. delta <- delta - IDCT_chunked(scatter(own payload))   what is sent leaves the momentum
    5. gather every peer's payload; with one_bit each value becomes its sign (+0 counts as +1)
       and bounded influence (docs/algorithms.md 1.11): per tensor, a payload whose values' norm
       is above max_norm_ratio times the lower median of the payloads' norms is scaled down to it
    6. aggregate: each coefficient is the mean over the payloads that selected it, 0 where none did
    7. p     <- p - lr * sign(IDCT_chunked(aggregate))   with sign(0) = 0

Steps 2-4 are DeMo.contribute, steps 1 and 5-7 are DeMo.apply. decode_payload parses the wire
format of src/agora/optim/payload.h. Standard library, numpy and torch only; all math in float32
except the DCT basis, which is computed in float64 and rounded once.
"""
import functools
import math
import struct

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------
# Chunked DCT


def chunk_size(n, chunk):
    """The largest divisor of n that is <= chunk (n itself when n <= chunk)."""
    if n <= chunk:
        return n
    for d in range(chunk, 0, -1):
        if n % d == 0:
            return d


def chunk_geometry(shape, chunk):
    """(chunk_rows, chunk_cols): a 1-D tensor is cut into rows, anything else into blocks over its
    last two dimensions."""
    if len(shape) == 1:
        return 1, chunk_size(shape[0], chunk)
    return chunk_size(shape[-2], chunk), chunk_size(shape[-1], chunk)


@functools.lru_cache(maxsize=None)
def dct_matrix(n):
    """Orthonormal DCT-II: C[k, j] = a_k cos(pi (2j + 1) k / (2n)), a_0 = sqrt(1/n), a_k = sqrt(2/n).
    Computed in float64, returned as float32 (shared and cached: do not modify it)."""
    k = np.arange(n, dtype=np.float64)[:, None]
    j = np.arange(n, dtype=np.float64)[None, :]
    a = np.where(k == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n))
    C = a * np.cos(math.pi * (2 * j + 1) * k / (2 * n))
    return torch.from_numpy(C.astype(np.float32))


def encode(x, chunk):
    """DCT_chunked: x of any shape -> coefficients [num_chunks, chunk_rows * chunk_cols], chunks in
    row-major block order (leading dimensions batch-major), a position inside a chunk being
    row * chunk_cols + column."""
    if x.dim() == 1:
        n = chunk_size(x.shape[0], chunk)
        C = dct_matrix(n)
        return x.reshape(-1, n) @ C.T  # each row x -> C x
    *lead, M, N = x.shape
    m, n = chunk_size(M, chunk), chunk_size(N, chunk)
    Cm, Cn = dct_matrix(m), dct_matrix(n)
    blocks = x.reshape(*lead, M // m, m, N // n, n).transpose(-3, -2)  # [..., M/m, N/n, m, n]
    coeffs = Cm @ blocks @ Cn.T  # each block B -> C_m B C_n^T
    return coeffs.reshape(-1, m * n)


def decode(coeffs, shape, chunk):
    """IDCT_chunked, the inverse of encode: the transpose of the basis."""
    shape = tuple(shape)
    if len(shape) == 1:
        n = chunk_size(shape[0], chunk)
        C = dct_matrix(n)
        return (coeffs.reshape(-1, n) @ C).reshape(shape)  # each row X -> C^T X
    *lead, M, N = shape
    m, n = chunk_size(M, chunk), chunk_size(N, chunk)
    Cm, Cn = dct_matrix(m), dct_matrix(n)
    blocks = coeffs.reshape(*lead, M // m, N // n, m, n)
    blocks = Cm.T @ blocks @ Cn  # each block X -> C_m^T X C_n
    return blocks.transpose(-3, -2).reshape(shape)


# ----------------------------------------------------------------------------------------------
# Selection and aggregation


def select_topk(coeffs, k):
    """Per chunk (row), the k coefficients of largest magnitude: positions [chunks, k] int64,
    ascending in each chunk, and their signed values [chunks, k]."""
    k = min(k, coeffs.shape[1])
    positions = coeffs.abs().topk(k, dim=1).indices.sort(dim=1).values
    return positions, coeffs.gather(1, positions)


def one_bit(values):
    """A transmitted value becomes its sign, +0 (and -0) counted as +1."""
    return torch.where(values < 0, -torch.ones_like(values), torch.ones_like(values))


def aggregate(contributions, num_chunks, size, quantize_one_bit):
    """Step 6: per coefficient, the mean of the values of the payloads that selected it, 0 where
    none did. contributions = [(positions, values), ...] in peer order; sums accumulate in that
    fixed order in float32 (positions are distinct within a chunk, so each scatter_add_ adds at
    most once to a coefficient), then divide by the count."""
    total = torch.zeros(num_chunks, size, dtype=torch.float32)
    count = torch.zeros(num_chunks, size, dtype=torch.float32)
    for positions, values in contributions:
        if quantize_one_bit:
            values = one_bit(values)
        total.scatter_add_(1, positions, values.to(torch.float32))
        count.scatter_add_(1, positions, torch.ones_like(values, dtype=torch.float32))
    return total / count.clamp(min=1.0)  # total is 0 where count is 0


def bound_influence(contributions, ratio):
    """Bounded influence (docs/algorithms.md 1.11), on one tensor's transmitted values
    (contributions = [(positions, values), ...] in peer order, one-bit values already signs):
    a payload whose norm is above ratio times the lower median of the nonzero norms has its values
    scaled down to that bound. Norms are sums of squares in float64, value by value in the wire
    order, as agora sums them; the scale is rounded to float32 once. ratio 0 turns it off."""
    if ratio <= 0 or len(contributions) < 2:
        return contributions
    norms = []
    for _, values in contributions:
        v = values.reshape(-1).to(torch.float64).numpy()
        norms.append(math.sqrt(float(np.cumsum(v * v)[-1])) if v.size else 0.0)
    nonzero = sorted(n for n in norms if n > 0)  # entries of all zeros are left out
    if not nonzero:
        return contributions
    bound = ratio * nonzero[(len(nonzero) - 1) // 2]
    out = []
    for (positions, values), norm in zip(contributions, norms):
        if norm > bound:
            values = values.to(torch.float32) * torch.tensor(f32(bound / norm), dtype=torch.float32)
        out.append((positions, values))
    return out


def f32(x):
    """x rounded to float32, as a Python float (exact in float32 arithmetic)."""
    return float(np.float32(x))


# ----------------------------------------------------------------------------------------------
# The optimizer


class DeMo:
    def __init__(self, beta=0.999, topk=32, chunk=64, weight_decay=0.0, one_bit=False,
                 max_norm_ratio=1.0):
        self.beta, self.topk, self.chunk = beta, topk, chunk
        self.weight_decay, self.one_bit = weight_decay, one_bit
        self.max_norm_ratio = max_norm_ratio
        self.delta = None  # per tensor, same shape as the parameter; zeros until the first step

    def contribute(self, grads, lr):
        """Steps 2-4. Returns this peer's payload: per tensor (positions, values), values
        unquantized float32; updates self.delta."""
        if self.delta is None:
            self.delta = [torch.zeros_like(g, dtype=torch.float32) for g in grads]
        payload = []
        for delta, g in zip(self.delta, grads):
            delta.mul_(self.beta).add_(g, alpha=lr)  # 2. momentum, lr folded in
            X = encode(delta, self.chunk)  # 3. chunked DCT ...
            positions, values = select_topk(X, self.topk)  # ... and top-k per chunk
            sent = torch.zeros_like(X).scatter_(1, positions, values)
            delta.sub_(decode(sent, delta.shape, self.chunk))  # 4. the sent part leaves delta
            payload.append((positions, values))
        return payload

    def apply(self, params, payloads, lr):
        """Steps 1 and 5-7, in place. payloads = one payload per peer, in peer-id order (each as
        returned by contribute). Returns per tensor the update before the sign,
        IDCT_chunked(aggregate).

        Rounding, where the spec leaves it open: 1 - lr*wd is computed in float64 and rounded to
        float32; lr is rounded to float32; then both products are float32 multiplications (the
        second is exact, the sign being -1, 0 or 1)."""
        updates = []
        for i, p in enumerate(params):
            p.mul_(f32(1.0 - lr * self.weight_decay))  # 1. decoupled weight decay
            rows, cols = chunk_geometry(p.shape, self.chunk)
            size = rows * cols
            sent = [payload[i] for payload in payloads]
            if self.one_bit:  # 5. what crosses the wire is the sign
                sent = [(positions, one_bit(values)) for positions, values in sent]
            sent = bound_influence(sent, self.max_norm_ratio)  # 1.11
            mean = aggregate(sent, p.numel() // size, size, False)  # 6
            update = decode(mean, p.shape, self.chunk)
            p.sub_(torch.sign(update), alpha=f32(lr))  # 7. sign(0) = 0
            updates.append(update)
        return updates


# ----------------------------------------------------------------------------------------------
# The wire format (src/agora/optim/payload.h, version 2, little-endian)

PAYLOAD_KINDS = {1: "demo", 2: "gradient", 3: "pseudo_gradient"}
ENCODINGS = {1: "dct_topk", 2: "dense", 3: "int8_rows"}
VALUE_TYPES = {1: "f32", 2: "bf16", 3: "one_bit", 4: "int8"}


def position_code(n, k):
    """The position code of a chunk of n coefficients with top-k (payload.h, position_code.h):
    ("rank", bits per chunk, C(n, k)) while C(n, k) < 2^64, else ("elias_fano", bits per chunk,
    L) with L the smallest low-bit width minimising k L + k + ((n - 1) >> L)."""
    count = math.comb(n, k)
    if count < 1 << 64:
        return "rank", (count - 1).bit_length(), count
    low = min(range(33), key=lambda L: (k * L + k + ((n - 1) >> L), L))
    return "elias_fano", k * low + k + ((n - 1) >> low), low


def position_bytes(n, k, chunks):
    return (chunks * position_code(n, k)[1] + 7) // 8


def encode_positions(positions, n, k):
    """positions [chunks, k], each row strictly ascending below n -> the position bytes."""
    kind, bits, param = position_code(n, k)
    out, acc, fill = bytearray(), 0, 0
    for row in positions:
        row = [int(p) for p in row]
        if kind == "rank":
            word = sum(math.comb(p, i + 1) for i, p in enumerate(row))
        else:
            word = 0
            for i, p in enumerate(row):
                word |= (p & ((1 << param) - 1)) << (i * param)
                word |= 1 << (k * param + (p >> param) + i)
        acc |= word << fill
        fill += bits
        while fill >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            fill -= 8
    if fill:
        out.append(acc)
    return bytes(out)


def decode_positions(raw, n, k, chunks):
    """The position bytes of `chunks` chunks -> positions [chunks, k] int64; ValueError on any
    encoding the C++ encoder would not write."""
    kind, bits, param = position_code(n, k)
    raw = bytes(raw)
    if chunks * bits % 8 and raw[-1] >> (chunks * bits % 8):
        raise ValueError("position padding bits set")
    out = np.zeros((chunks, k), dtype=np.int64)
    for c in range(chunks):
        start = c * bits
        word = int.from_bytes(raw[start // 8:(start + bits + 7) // 8 + 1], "little")
        word = (word >> (start % 8)) & ((1 << bits) - 1)
        if kind == "rank":
            if word >= param:
                raise ValueError(f"chunk {c}: rank {word} >= C({n}, {k})")
            r, hi = word, n - 1
            for i in range(k - 1, -1, -1):
                lo = i  # the largest p in [i, hi] with C(p, i + 1) <= r
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if math.comb(mid, i + 1) <= r:
                        lo = mid
                    else:
                        hi = mid - 1
                out[c, i] = lo
                r -= math.comb(lo, i + 1)
                hi = lo - 1
        else:
            low = param
            bitmap = word >> (k * low)
            ones = [b for b in range(k + ((n - 1) >> low)) if bitmap >> b & 1]
            if len(ones) != k:
                raise ValueError(f"chunk {c}: Elias-Fano bitmap has {len(ones)} bits set, not {k}")
            for i, b in enumerate(ones):
                out[c, i] = ((b - i) << low) | ((word >> (i * low)) & ((1 << low) - 1))
    if (out >= n).any() or (np.diff(out, axis=1) <= 0).any():
        raise ValueError("positions out of range or not strictly ascending")
    return out


def bf16_to_f32(raw_u16):
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


class _Reader:
    def __init__(self, data):
        self.data, self.at = memoryview(data), 0

    def take(self, n, what):
        if self.at + n > len(self.data):
            raise ValueError(f"payload truncated reading {what}: need {n} bytes at {self.at}, "
                             f"have {len(self.data) - self.at}")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def unpack(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))

    def array(self, dtype, count, what):
        dtype = np.dtype(dtype)
        return np.frombuffer(self.take(dtype.itemsize * count, what), dtype=dtype).copy()


def decode_payload(data):
    """Parses payload bytes. Returns {"kind", "step", "tensors": [...]}, each tensor a dict with
    shape, encoding, value_type and, by encoding:
      dct_topk:  chunk_rows, chunk_cols, topk, num_chunks, positions [chunks, topk] int64,
                 values [chunks, topk] float32 (one-bit values as +1.0 / -1.0);
      dense:     values, float32 in the tensor's shape;
      int8_rows: values = q * scale of its row, float32 in the tensor's shape.
    Raises ValueError on malformed input."""
    r = _Reader(data)
    magic = bytes(r.take(4, "magic"))
    if magic != b"AGPL":
        raise ValueError(f"bad magic {magic!r}")
    version, kind, flags, step, count = r.unpack("<HBBQI", "header")
    if version != 2:
        raise ValueError(f"unsupported version {version} (allowed: 2)")
    if kind not in PAYLOAD_KINDS or flags != 0:
        raise ValueError(f"bad kind {kind} or flags {flags}")
    tensors = []
    for t in range(count):
        ndim, enc, vtype, reserved = r.unpack("<BBBB", f"tensor {t} header")
        if not 1 <= ndim <= 8 or reserved != 0:
            raise ValueError(f"tensor {t}: ndim {ndim}, reserved {reserved}")
        if enc not in ENCODINGS or vtype not in VALUE_TYPES:
            raise ValueError(f"tensor {t}: encoding {enc}, value type {vtype}")
        shape = list(r.unpack(f"<{ndim}I", f"tensor {t} dims"))
        if min(shape) < 1:
            raise ValueError(f"tensor {t}: dimension 0 in {shape}")
        numel = math.prod(shape)
        entry = {"shape": shape, "encoding": ENCODINGS[enc], "value_type": VALUE_TYPES[vtype]}
        if ENCODINGS[enc] == "dct_topk":
            rows, cols, topk = r.unpack("<III", f"tensor {t} chunk geometry")
            last2 = [1, shape[0]] if ndim == 1 else shape[-2:]
            if rows < 1 or cols < 1 or last2[0] % rows or last2[1] % cols:
                raise ValueError(f"tensor {t}: chunk {rows}x{cols} does not divide {shape}")
            size = rows * cols
            if not 1 <= topk <= size:
                raise ValueError(f"tensor {t}: topk {topk} not in [1, {size}]")
            chunks = numel // size
            n = chunks * topk
            raw = r.take(position_bytes(size, topk, chunks), f"tensor {t} positions")
            try:
                positions = decode_positions(raw, size, topk, chunks)
            except ValueError as e:
                raise ValueError(f"tensor {t}: {e}") from None
            if VALUE_TYPES[vtype] == "f32":
                values = r.array("<f4", n, f"tensor {t} values")
            elif VALUE_TYPES[vtype] == "bf16":
                values = bf16_to_f32(r.array("<u2", n, f"tensor {t} values"))
            elif VALUE_TYPES[vtype] == "one_bit":
                packed = r.array("u1", (n + 7) // 8, f"tensor {t} values")
                bits = np.unpackbits(packed, bitorder="little")
                if bits[n:].any():
                    raise ValueError(f"tensor {t}: one-bit padding bits set")
                values = np.where(bits[:n] == 1, np.float32(-1.0), np.float32(1.0))
            else:
                raise ValueError(f"tensor {t}: value type int8 with dct_topk")
            entry.update(chunk_rows=rows, chunk_cols=cols, topk=topk, num_chunks=chunks,
                         positions=positions, values=values.astype(np.float32).reshape(chunks, topk))
        elif ENCODINGS[enc] == "dense":
            if VALUE_TYPES[vtype] == "f32":
                values = r.array("<f4", numel, f"tensor {t} values")
            elif VALUE_TYPES[vtype] == "bf16":
                values = bf16_to_f32(r.array("<u2", numel, f"tensor {t} values"))
            else:
                raise ValueError(f"tensor {t}: dense with value type {VALUE_TYPES[vtype]}")
            entry["values"] = values.reshape(shape)
        else:  # int8_rows
            if VALUE_TYPES[vtype] != "int8":
                raise ValueError(f"tensor {t}: int8_rows with value type {VALUE_TYPES[vtype]}")
            row_count = numel // shape[-1] if ndim > 1 else 1
            scales = r.array("<f4", row_count, f"tensor {t} scales")
            q = r.array("i1", numel, f"tensor {t} values")
            values = q.reshape(row_count, -1).astype(np.float32) * scales[:, None]
            entry.update(scales=scales, values=values.reshape(shape))
        if "values" in entry and not np.isfinite(entry["values"]).all():
            raise ValueError(f"tensor {t}: non-finite value")
        tensors.append(entry)
    if r.at != len(r.data):
        raise ValueError(f"{len(r.data) - r.at} trailing bytes")
    return {"kind": PAYLOAD_KINDS[kind], "step": step, "tensors": tensors}
