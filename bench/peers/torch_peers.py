#!/usr/bin/python3
"""PyTorch peers of linattn's attention operations, timed on this machine.

What a user would write in PyTorch instead of linattn (Debian's
python3-torch on OpenBLAS; see tools/linattn_ref.py for the AVX-512 note):

  decode        the recurrent step of B sessions at once, H heads of d:
                S += φ(k)vᵀ, z += φ(k), y = φ(q)ᵀS / φ(q)ᵀz  (φ = elu + 1),
                written with einsum and with in-place baddbmm/bmm
  chunkwise     causal linear-attention prefill of one sequence in chunks
                of 64: intra-chunk masked products plus the carried state
  softmax_kv    softmax attention decoding one token against a KV cache of
                n tokens (the cost linear attention removes)
  softmax_fwd   causal softmax prefill of T tokens (heads one at a time)

    /usr/bin/python3 bench/peers/torch_peers.py [--quick] > peers.json

Prints one JSON object; every time is the median of several runs, in
seconds. bench/compare puts these beside linattn's own numbers.
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


def median_time(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def phi(x):
    return F.elu(x) + 1


def decode(batch, heads, d, repeat):
    """The recurrent step, two ways; the faster one is the peer."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, d, generator=g) for _ in range(3))
    state_bytes = batch * heads * (d * d + d) * 4
    rows = []

    # einsum / broadcasting: what the formula reads like.
    s = torch.zeros(batch, heads, d, d)
    z = torch.zeros(batch, heads, d)

    def step_einsum():
        pk = phi(k)
        s.add_(pk.unsqueeze(-1) * v.unsqueeze(-2))
        z.add_(pk)
        pq = phi(q)
        num = torch.einsum("bhd,bhde->bhe", pq, s)
        return num / (pq * z).sum(-1, keepdim=True)

    # In-place batched BLAS: S += φk vᵀ as a rank-1 baddbmm into S, the
    # read-out as one bmm over all (session, head) pairs.
    s2 = torch.zeros(batch * heads, d, d)
    z2 = torch.zeros(batch * heads, d)
    q2, k2, v2 = (x.reshape(batch * heads, d) for x in (q, k, v))

    def step_bmm():
        pk = phi(k2)
        torch.baddbmm(s2, pk.unsqueeze(2), v2.unsqueeze(1), out=s2)
        z2.add_(pk)
        pq = phi(q2)
        num = torch.bmm(pq.unsqueeze(1), s2).squeeze(1)
        return num / (pq * z2).sum(-1, keepdim=True)

    for name, fn in (("einsum", step_einsum), ("baddbmm", step_bmm)):
        t = median_time(fn, repeat)
        rows.append({"op": "decode", "variant": name, "batch": batch, "heads": heads,
                     "d": d, "seconds": t, "state_bytes": state_bytes,
                     "rmw_gb_per_s": 2 * state_bytes / t / 1e9})
    return rows


def chunkwise_attention(q, k, v, chunk=64):
    """Causal normalised linear attention of (H, T, d) inputs, chunk by chunk."""
    heads, tokens, d = q.shape
    mask = torch.ones(chunk, chunk, dtype=q.dtype).tril()
    pq, pk = phi(q), phi(k)
    s = torch.zeros(heads, d, v.shape[-1], dtype=q.dtype)
    z = torch.zeros(heads, d, dtype=q.dtype)
    out = torch.empty(heads, tokens, v.shape[-1], dtype=q.dtype)
    for c0 in range(0, tokens, chunk):
        cq, ck, cv = pq[:, c0:c0 + chunk], pk[:, c0:c0 + chunk], v[:, c0:c0 + chunk]
        n = cq.shape[1]
        a = (cq @ ck.transpose(1, 2)) * mask[:n, :n]
        num = a @ cv + cq @ s
        den = a.sum(-1) + (cq @ z.unsqueeze(-1)).squeeze(-1)
        out[:, c0:c0 + n] = num / den.unsqueeze(-1)
        s += ck.transpose(1, 2) @ cv
        z += ck.sum(1)
    return out


def check_chunkwise():
    """The peer must compute the right thing: against the quadratic form."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 200, 8, generator=g, dtype=torch.float64) for _ in range(3))
    a = (phi(q) @ phi(k).transpose(1, 2)).tril()
    direct = (a @ v) / a.sum(-1, keepdim=True)
    err = (chunkwise_attention(q, k, v, chunk=64) - direct).abs().max().item()
    if err > 1e-12:
        raise SystemExit(f"chunkwise peer disagrees with the quadratic form by {err}")


def chunkwise(tokens, heads, d, repeat, chunk=64):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(heads, tokens, d, generator=g) for _ in range(3))

    def run():
        return chunkwise_attention(q, k, v, chunk)

    t = median_time(run, repeat)
    flops = heads * (tokens // chunk) * 2 * chunk * (chunk * d + 2 * d * d + chunk * d)
    return {"op": "chunkwise", "tokens": tokens, "heads": heads, "d": d, "seconds": t,
            "tokens_per_s": tokens / t, "gflops": flops / t / 1e9}


def softmax_kv(context, heads, d, repeat):
    g = torch.Generator().manual_seed(2)
    kc = torch.randn(heads, context, d, generator=g)
    vc = torch.randn(heads, context, d, generator=g)
    q = torch.randn(heads, 1, d, generator=g)
    scale = d ** -0.5

    def step():
        w = torch.softmax((q @ kc.transpose(1, 2)) * scale, dim=-1)
        return w @ vc

    t = median_time(step, repeat)
    return {"op": "softmax_kv_decode", "context": context, "heads": heads, "d": d,
            "seconds": t, "kv_bytes": 2 * heads * context * d * 4}


def softmax_fwd(tokens, heads, d, repeat):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(heads, tokens, d, generator=g) for _ in range(3))
    scale = d ** -0.5
    causal = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)

    def run():
        out = torch.empty(heads, tokens, d)
        for h in range(heads):  # one T×T matrix at a time
            a = (q[h] @ k[h].T) * scale
            a.masked_fill_(causal, float("-inf"))
            out[h] = torch.softmax(a, dim=-1) @ v[h]
        return out

    t = median_time(run, repeat)
    return {"op": "softmax_causal_prefill", "tokens": tokens, "heads": heads, "d": d,
            "seconds": t, "tokens_per_s": tokens / t}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    check_chunkwise()
    rows = []
    rep = 3 if args.quick else 20
    for d in (64, 128):
        for b in (1, 64):
            rows.extend(decode(b, 8, d, rep))
        for t in ((1024, 4096) if args.quick else (1024, 4096, 16384, 65536)):
            rows.append(chunkwise(t, 8, d, 3))
        contexts = (1024, 4096) if args.quick else (1024, 4096, 16384, 65536, 262144)
        for n in contexts:
            rows.append(softmax_kv(n, 8, d, rep))
        for t in ((512, 1024) if args.quick else (1024, 4096, 16384)):
            rows.append(softmax_fwd(t, 8, d, 2 if args.quick or t < 16384 else 1))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    json.dump({"torch": torch.__version__, "threads": args.threads,
               "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""), "rows": rows},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
