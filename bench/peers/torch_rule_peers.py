#!/usr/bin/python3
"""PyTorch peers of the gated and delta rules, timed on this machine.

What a user would run in PyTorch instead of linattn (Debian's python3-torch
on OpenBLAS), following fla's plain-PyTorch ops (fla/ops/simple_gla/naive.py,
gla/naive.py, delta_rule/naive.py, gated_delta_rule/naive.py):

  decode     one recurrent step of B sessions at once, H heads of d, per rule:
               gated_head   S = e^g S + k vᵀ                (g per head)
               gated_key    S = diag(e^g) S + k vᵀ          (g per key channel)
               delta        S = S + k (β(v − Sᵀk))ᵀ
               gated_delta  S = e^g S;  S = S + k (β(v − Sᵀk))ᵀ
             o = Sᵀq; written with in-place batched BLAS (baddbmm/bmm) and
             with einsum, the faster counting
  chunkwise  prefill of one sequence in chunks of 64 in fla's chunk form
             (cumulative log-gates, the delta rules' UT transform solved as a
             triangular system), each checked against its recurrence first

    /usr/bin/python3 bench/peers/torch_rule_peers.py [--quick] > peers.json

Prints one JSON object; every time is the median of several runs.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import linattn_ref  # noqa: E402,F401  (sets OPENBLAS_CORETYPE before torch loads)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peers import median_time  # noqa: E402

RULES = ("gated_head", "gated_key", "delta", "gated_delta")


def inputs(rule, batch, heads, tokens, d, dtype=torch.float32, seed=0):
    """(B, H, T, d) q, k, v; log-gates in [−0.1, 0]; β in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.rand(batch, heads, tokens, d, generator=g, dtype=dtype) * 2 - 1
               for _ in range(3))
    if rule in ("delta", "gated_delta"):
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    width = d if rule == "gated_key" else 1
    gate = -0.1 * torch.rand(batch, heads, tokens, width, generator=g, dtype=dtype)
    if rule == "delta":
        gate.zero_()  # no gates
    beta = torch.rand(batch, heads, tokens, generator=g, dtype=dtype)
    return q, k, v, gate, beta


def recurrence(rule, q, k, v, gate, beta):
    """The rule token by token (fla's naive recurrent form); (B, H, T, d)."""
    b, h, t, d = q.shape
    s = torch.zeros(b, h, d, v.shape[-1], dtype=q.dtype)
    out = torch.empty_like(v)
    for i in range(t):
        if rule != "delta":
            s = s * gate[:, :, i].exp()[..., None]
        if rule in ("delta", "gated_delta"):
            u = (s * k[:, :, i, :, None]).sum(-2)
            e = (v[:, :, i] - u) * beta[:, :, i, None]
            s = s + k[:, :, i, :, None] * e[..., None, :]
        else:
            s = s + k[:, :, i, :, None] * v[:, :, i, None, :]
        out[:, :, i] = (q[:, :, i, :, None] * s).sum(-2)
    return out


def chunk_form(rule, q, k, v, gate, beta, chunk=64):
    """fla's chunk form of the rule; (B, H, T, d) with T a multiple of chunk."""
    b, h, t, d = q.shape
    dv = v.shape[-1]
    n = t // chunk
    q, k, v = (x.reshape(b, h, n, chunk, -1) for x in (q, k, v))
    cum = gate.reshape(b, h, n, chunk, -1).cumsum(3)  # (b, h, n, C, 1 or d)
    eye = torch.eye(chunk, dtype=q.dtype)
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    if rule == "gated_key":
        # GLA's scores as a PyTorch user writes them: (q ⊙ e^b)(k ⊙ e^{−b})ᵀ.
        # Fine for these gates (|b| ≤ 6.4 in a chunk); e^{−b} overflows fp32
        # once a chunk's gates sum below −88, which linattn's sub-chunk form
        # never meets.
        attn = ((q * cum.exp()) @ (k * (-cum).exp()).transpose(-1, -2)).masked_fill(
            ~lower, 0.0)
    else:
        c = cum[..., 0]
        decay = (c[..., :, None] - c[..., None, :]).masked_fill(~lower, float("-inf")).exp()
        attn = (q @ k.transpose(-1, -2)) * decay
    if rule in ("delta", "gated_delta"):
        kb = k * beta.reshape(b, h, n, chunk, 1)
        m = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
        tri = torch.linalg.solve_triangular(eye + m, eye, upper=False)   # (I + M)⁻¹
        u = tri @ (v * beta.reshape(b, h, n, chunk, 1))
        w = tri @ (kb * cum.exp())
    else:
        u = v
    s = torch.zeros(b, h, d, dv, dtype=q.dtype)
    out = torch.empty(b, h, n, chunk, dv, dtype=q.dtype)
    for i in range(n):
        ui = u[:, :, i]
        if rule in ("delta", "gated_delta"):
            ui = ui - w[:, :, i] @ s
        out[:, :, i] = (q[:, :, i] * cum[:, :, i].exp()) @ s + attn[:, :, i] @ ui
        end = cum[:, :, i, -1]                                   # (b, h, 1 or d)
        s = s * end.exp()[..., None]
        s = s + (k[:, :, i] * (end[:, :, None, :] - cum[:, :, i]).exp()).transpose(-1, -2) @ ui
    return out.reshape(b, h, t, dv)


def check_chunk_forms():
    """Each chunk form against its recurrence, in float64."""
    for rule in RULES:
        q, k, v, gate, beta = inputs(rule, 1, 2, 192, 8, torch.float64, seed=7)
        err = (chunk_form(rule, q, k, v, gate, beta) - recurrence(rule, q, k, v, gate, beta))
        err = err.abs().max().item()
        if err > 1e-9:
            raise SystemExit(f"{rule}: the chunk form disagrees with the recurrence by {err}")


def decode(rule, batch, heads, d, repeat):
    q, k, v, gate, beta = (x[:, :, 0] for x in inputs(rule, batch, heads, 1, d))
    n = batch * heads
    q2, k2, v2 = (x.reshape(n, d) for x in (q, k, v))
    a2 = gate.reshape(n, -1).exp()
    b2 = beta.reshape(n, 1)
    s = torch.zeros(n, d, d)

    def step_bmm():
        if rule != "delta":
            s.mul_(a2.unsqueeze(-1))          # a gate per head or per key row
        if rule in ("delta", "gated_delta"):
            u = torch.bmm(k2.unsqueeze(1), s).squeeze(1)
            e = (v2 - u) * b2
            torch.baddbmm(s, k2.unsqueeze(2), e.unsqueeze(1), out=s)
        else:
            torch.baddbmm(s, k2.unsqueeze(2), v2.unsqueeze(1), out=s)
        return torch.bmm(q2.unsqueeze(1), s).squeeze(1)

    s3 = torch.zeros(batch, heads, d, d)
    a3 = gate.exp()

    def step_einsum():
        if rule != "delta":
            s3.mul_(a3.unsqueeze(-1))
        if rule in ("delta", "gated_delta"):
            u = torch.einsum("bhd,bhde->bhe", k, s3)
            s3.add_(k.unsqueeze(-1) * ((v - u) * beta.unsqueeze(-1)).unsqueeze(-2))
        else:
            s3.add_(k.unsqueeze(-1) * v.unsqueeze(-2))
        return torch.einsum("bhd,bhde->bhe", q, s3)

    best = None
    for name, fn in (("baddbmm", step_bmm), ("einsum", step_einsum)):
        t = median_time(fn, repeat)
        if best is None or t < best["seconds"]:
            best = {"op": "rule_decode", "rule": rule, "variant": name, "batch": batch,
                    "heads": heads, "d": d, "seconds": t}
    return best


def chunkwise(rule, tokens, heads, d, repeat):
    q, k, v, gate, beta = inputs(rule, 1, heads, tokens, d)
    t = median_time(lambda: chunk_form(rule, q, k, v, gate, beta), repeat)
    return {"op": "rule_chunkwise", "rule": rule, "tokens": tokens, "heads": heads, "d": d,
            "seconds": t, "tokens_per_s": tokens / t}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    check_chunk_forms()
    rows = []
    rep = 3 if args.quick else 20
    for rule in RULES:
        for d in (64, 128):
            for b in (1, 64):
                rows.append(decode(rule, b, 8, d, rep))
            for t in ((4096,) if args.quick else (4096, 16384)):
                rows.append(chunkwise(rule, t, 8, d, 1 if args.quick else 3))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    json.dump({"torch": torch.__version__, "threads": args.threads, "rows": rows},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
