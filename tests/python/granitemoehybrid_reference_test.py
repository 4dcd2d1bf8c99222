#!/usr/bin/python3
"""Checks tools/linattn_ref.py's granitemoehybrid against second paths, in
float64: the Mamba layer's token recurrence against transformers' chunked
scan (GraniteMoeHybridMambaLayer.torch_forward without a cache: segment_sum
and the four SSD terms, transcribed here); the sparse MoE against every expert
on every token weighted by gates that are zero outside the top k; `rotary`
against GraniteMoeHybridRotaryEmbedding's tables; whole sequences against
token-by-token steps, a split sequence and batches against single rows.
Exits non-zero on a mismatch. Run: /usr/bin/python3 tests/python/granitemoehybrid_reference_test.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import linattn_ref as R  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_default_dtype(torch.float64)
FAILED = []


def check(name, a, b, tol=1e-10):
    err = (a - b).abs().max().item() / max(1.0, b.abs().max().item())
    print(f"{'ok  ' if err <= tol else 'FAIL'} {name}: {err:.2e}")
    if not err <= tol:
        FAILED.append(name)


BASE = {"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 3,
        "vocab_size": 300, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
        "shared_intermediate_size": 48, "position_embedding_type": "rope",
        "layer_types": ["mamba", "attention", "mamba"], "mamba_n_heads": 8,
        "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625, "logits_scaling": 6.0, "rms_norm_eps": 1e-5}


# ---- transformers' chunked scan (torch_forward, no cache), transcribed


def segment_sum(x):
    T = x.size(-1)
    x = x[..., None].expand(*x.size(), T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1), 0)
    x = torch.cumsum(x, dim=-2)
    return x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=0), -torch.inf)


def chunks(t, pad, size):
    t = F.pad(t, (0, 0, 0, 0, 0, pad) if t.dim() == 4 else (0, 0, 0, pad))
    return t.reshape(t.shape[0], -1, size, *t.shape[2:])


def chunked_mamba(m, x, chunk_size):
    c = m.c
    b, T, _ = x.shape
    I, H, P, N, G = (c.mamba_intermediate, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state,
                     c.mamba_n_groups)
    gate, xbc, dt = m.in_proj(x).split([I, c.mamba_conv_dim, H], dim=-1)
    xbc = F.silu(m.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
    hs, B, C = xbc.split([I, G * N, G * N], dim=-1)
    A = -torch.exp(m.A_log)
    dt = torch.clamp(F.softplus(dt + m.dt_bias), *c.time_step_limit)
    hs = hs.reshape(b, T, -1, P)
    B = B.reshape(b, T, -1, N).repeat_interleave(H // G, dim=2)
    C = C.reshape(b, T, -1, N).repeat_interleave(H // G, dim=2)
    pad = (chunk_size - T % chunk_size) % chunk_size
    D_residual = m.D[..., None] * F.pad(hs, (0, 0, 0, 0, 0, pad))
    hs = hs * dt[..., None]
    A = A * dt
    hs, A, B, C = [chunks(t, pad, chunk_size) for t in (hs, A, B, C)]
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(segment_sum(A))
    G_ = (C[:, :, :, None, :, :] * B[:, :, None, :, :, :]).sum(-1)
    M = (G_[..., None] * L.permute(0, 2, 3, 4, 1)[..., None]).sum(-1)
    Y_diag = (M[..., None] * hs[:, :, None]).sum(3)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = (B_decay[..., None, :] * hs[..., None]).sum(2)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    states = (decay_chunk[..., None, None] * states[:, :, None, ...]).sum(1)[:, :-1]
    Y_off = ((C[..., None, :] * states[:, :, None, ...]).sum(-1) *
             torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None])
    y = (Y_diag + Y_off).reshape(b, -1, H, P) + D_residual
    y = y[:, :T].reshape(b, T, -1)
    # GraniteMoeHybridRMSNormGated
    y = y * F.silu(gate)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + c.norm_eps)
    return m.out_proj(m.norm.weight * y)


def main():
    torch.manual_seed(0)
    for over in ({}, {"mamba_proj_bias": True, "mamba_conv_bias": False, "mamba_d_conv": 3,
                      "time_step_limit": [0.01, 0.05]}, {"mamba_n_groups": 8}):
        model = R.random_model({**BASE, **over}, seed=1).double()
        layer = model.model.layers[0].mamba
        x = torch.randn(2, 21, 64)
        with torch.no_grad():
            check(f"mamba recurrence = chunked scan {over}", layer(x), chunked_mamba(layer, x, 8))
            whole = layer(x)
            o1, st = layer.run(x[:, :9], layer.new_state(2, x.dtype))
            o2, _ = layer.run(x[:, 9:], st)
            check("mamba split sequence", torch.cat([o1, o2], 1), whole)

    # MoE: every expert on every token, gates zero outside the top k.
    for k in (1, 2, 3):
        model = R.random_model({**BASE, "num_experts_per_tok": k}, seed=2).double()
        moe = model.model.layers[0].block_sparse_moe
        x = torch.randn(3, 11, 64)
        with torch.no_grad():
            logits = x @ moe.router.layer.weight.t()
            top, idx = logits.topk(k, dim=-1)
            gates = torch.zeros_like(logits).scatter(-1, idx, top.softmax(-1))
            a = torch.einsum("btd,eod->bteo", x, moe.input_linear.weight)
            a1, a2 = a.chunk(2, dim=-1)
            y = torch.einsum("btei,eoi->bteo", F.silu(a1) * a2, moe.output_linear.weight)
            check(f"moe top-{k} = dense", moe(x), (gates[..., None] * y).sum(2))
            used = len(set(idx.flatten().tolist()))
            print(f"     top-{k}: {used} of 4 experts chosen across tokens")
            if used < 2:
                FAILED.append(f"routing does not vary (top-{k})")

    # Rotary: GraniteMoeHybridRotaryEmbedding.forward's tables (float32) and
    # apply_rotary_pos_emb.
    d, theta = 16, 500.0
    q = torch.randn(1, 7, 2, d, dtype=torch.float32)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = (inv[None, :, None] @ torch.arange(5, 12)[None, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, :, None], emb.sin()[:, :, None]
    rot = torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1)
    check("rotary = transformers' tables", R.rotary(q, 5, theta), q * cos + rot * sin, 1e-6)

    # Whole sequences against steps, a split and single rows.
    for over in ({}, {"position_embedding_type": "nope", "num_local_experts": 0},
                 {"shared_intermediate_size": 0, "num_experts_per_tok": 1,
                  "tie_word_embeddings": True, "attention_bias": True,
                  "layers_block_type": ["attention", "mamba", "attention"]},
                 {"layer_types": None, "num_key_value_heads": 1}):
        model = R.random_model({**BASE, **over}, seed=3).double()
        tokens = torch.randint(0, 300, (3, 13))
        with torch.no_grad():
            whole = model(tokens)
            states = model.new_state(3, torch.float64)
            steps = []
            for t in range(13):
                logits, states = model.step(tokens[:, t], states)
                steps.append(logits)
            check(f"forward = steps {over}", torch.stack(steps, 1), whole)
            check("batch = rows", torch.cat([model(tokens[i:i + 1]) for i in range(3)]), whole)
    if FAILED:
        print("FAILED:", ", ".join(FAILED))
        sys.exit(1)
    print("all granitemoehybrid reference checks passed")


if __name__ == "__main__":
    main()
