#!/usr/bin/env python3
"""The Python side of bench_trainer: agora's training step written in plain PyTorch.

The same Llama as src/agora/model/llama.cc, op for op: RMSNorm in float32, rotary embedding in
the "rotate half" convention, grouped-query attention by repeat_interleave, written-out causal
attention with an explicit boolean mask (libtorch 1.13 has no scaled_dot_product_attention, and
agora does not use it either), SwiGLU MLP, no biases, optional tied embeddings, vocabulary padded
to a multiple of 64. The same init (normal(0, init_std) for matrices, init_std / sqrt(2L) for
o_proj and down_proj, norms at 1), the same loss (mean cross-entropy in float32), the same step
(gradients set to None; per micro-batch forward, loss / accumulation steps, backward;
clip_grad_norm_(1.0), AdamW with decay on the >= 2-D parameters only).

bench_trainer passes the model's shape from agora's ModelConfig, so the two cannot drift. Tokens
are random, from a generator seeded like agora's worker (the same ids, given the same seed).

Prints one JSON line: parameters, threads, first_loss, last_loss, tokens_per_s (one per repeat),
and over the timed steps faults_per_step (minor page faults) and system_share (kernel CPU time over
all CPU time), from getrusage like agora's worker.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # Normalise in float32 whatever the activation dtype, as HF's LlamaRMSNorm does.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def apply_rotary(x, cos, sin):
    # x: [B, H, T, D]; rotate_half([a, b]) = [-b, a]
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads = a.num_heads, a.num_kv_heads
        self.head_dim = a.hidden_size // a.num_heads
        d, kv = a.hidden_size, a.num_kv_heads * self.head_dim
        # Registration order matches agora's (q, k, v, o), so named_parameters() does too.
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads  # HF's repeat_kv
            k = k.repeat_interleave(group, 1)
            v = v.repeat_interleave(group, 1)
        S = k.size(2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = Mlp(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    def __init__(self, a, padded_vocab):
        super().__init__()
        self.embed_tokens = nn.Embedding(padded_vocab, a.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(a) for _ in range(a.num_layers)])
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        padded_vocab = (a.vocab_size + 63) // 64 * 64
        self.model = Body(a, padded_vocab)
        self.lm_head = None if a.tie_embeddings else nn.Linear(a.hidden_size, padded_vocab, bias=False)
        # cos, sin: [T, D] float32, computed in float64 as agora's rotary_tables does.
        head_dim = a.hidden_size // a.num_heads
        pos_freqs = torch.pow(a.rope_theta, torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(a.seq_len, dtype=torch.float64), 1.0 / pos_freqs)
        doubled = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = doubled.cos().float(), doubled.sin().float()
        with torch.no_grad():
            std, residual_std = a.init_std, a.init_std / math.sqrt(2.0 * a.num_layers)
            for name, p in self.named_parameters():
                if p.dim() < 2:
                    continue
                p.normal_(0.0, residual_std if ("o_proj" in name or "down_proj" in name) else std)

    def forward(self, tokens):
        T = tokens.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return torch.matmul(x, head.t())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("vocab-size", "hidden-size", "intermediate-size", "num-layers", "num-heads",
                 "num-kv-heads", "seq-len", "batch", "micro-batch", "threads", "warmup", "steps", "repeats",
                 "seed"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--tie-embeddings", type=int, choices=(0, 1), required=True)
    for name in ("rope-theta", "rms-norm-eps", "init-std", "lr", "beta1", "beta2", "eps",
                 "weight-decay", "grad-clip"):
        p.add_argument("--" + name, type=float, required=True)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Llama(a)
    model.train()
    params = list(model.parameters())
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)

    T = a.seq_len
    generator = torch.Generator().manual_seed(a.seed + 1)
    batches = torch.randint(0, a.vocab_size, (a.warmup + a.steps * a.repeats, a.batch, T + 1),
                            generator=generator, dtype=torch.int64)

    M = a.micro_batch
    accumulation = a.batch // M

    def step(tokens):
        optimizer.zero_grad(set_to_none=True)
        value = 0.0
        for first in range(0, a.batch, M):
            micro = tokens[first:first + M]
            logits = model(micro[:, :T])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                   micro[:, 1:].reshape(-1)) / accumulation
            loss.backward()
            value += loss.item()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        optimizer.step()
        return value

    losses = []
    for i in range(a.warmup):
        losses.append(step(batches[i]))
    rates = []
    index = a.warmup
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(a.repeats):
        start = time.perf_counter()
        for _ in range(a.steps):
            losses.append(step(batches[index]))
            index += 1
        rates.append(a.steps * a.batch * T / (time.perf_counter() - start))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({
        "parameters": sum(q.numel() for q in params),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "tokens_per_s": rates,
        "faults_per_step": (after.ru_minflt - before.ru_minflt) / (a.steps * a.repeats),
        "system_share": (after.ru_stime - before.ru_stime) / cpu if cpu > 0 else 0.0,
    }))


if __name__ == "__main__":
    main()
