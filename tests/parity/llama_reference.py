#!/usr/bin/env python3
"""An independent Llama forward pass, written from Hugging Face's modeling_llama.py, that reads an
agora checkpoint (config.json + model.safetensors) with nothing but the standard library and numpy,
and prints the mean next-token cross-entropy over consecutive windows of an llm.c token shard:
window i has inputs tokens[i*T:(i+1)*T] and targets tokens[i*T+1:(i+1)*T+1], T the checkpoint's
max_position_embeddings. Supports rope_scaling {"rope_type": "yarn"} the way HF computes it.

usage: llama_reference.py CHECKPOINT_DIR SHARD.bin MAX_WINDOWS
"""
import json
import math
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[base + begin : base + end], dtype="<f4").reshape(info["shape"])
    return out


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20240520 and header[1] in (1, 2), header[:3]
    dtype = "<u2" if header[1] == 1 else "<u4"
    return np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2])).astype(np.int64)


def rope_inv_freq(cfg, dim):
    base = cfg.get("rope_theta", 10000.0)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return 1.0 / pos_freqs, 1.0
    assert scaling.get("rope_type", scaling.get("type")) == "yarn"
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast", 32)
    beta_slow = scaling.get("beta_slow", 1)
    attention_factor = 0.1 * math.log(factor) + 1.0  # HF's get_mscale(factor)

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (
        1.0 / pos_freqs
    ) * extrapolation_factor
    return inv_freq, attention_factor


def rms_norm(x, weight, eps):
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(w, cfg, tokens):
    """tokens: [T] -> logits [T, V] in float64."""
    d = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = d // heads
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    inv_freq, attention_factor = rope_inv_freq(cfg, head_dim)
    angles = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb) * attention_factor, np.sin(emb) * attention_factor
    mask = np.triu(np.full((T, T), -np.inf), k=1)

    x = w["model.embed_tokens.weight"][tokens].astype(np.float64)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, heads, head_dim).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, kv_heads, head_dim).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, kv_heads, head_dim).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, heads // kv_heads, axis=0)  # HF's repeat_kv
        v = np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = scores / scores.sum(axis=-1, keepdims=True)
        out = (attn @ v).transpose(1, 0, 2).reshape(T, d)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def main():
    checkpoint, shard, max_windows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(f"{checkpoint}/config.json") as f:
        cfg = json.load(f)
    w = read_safetensors(f"{checkpoint}/model.safetensors")
    tokens = read_shard(shard)
    T = cfg["max_position_embeddings"]
    windows = min((len(tokens) - 1) // T, max_windows) if max_windows > 0 else (len(tokens) - 1) // T
    total = 0.0
    for i in range(windows):
        window = tokens[i * T : (i + 1) * T + 1]
        logits = forward(w, cfg, window[:-1])
        m = logits.max(axis=-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
        total += float(np.sum(logz - logits[np.arange(T), window[1:]]))
    print(json.dumps({"val_loss": total / (windows * T), "windows": windows}))


if __name__ == "__main__":
    main()
