#!/usr/bin/python3
"""Checks tools/linattn_ref.py's qwen3_next against second paths, in float64
(transformers' own float32 casts left out): the Gated DeltaNet layer's token
recurrence against transformers' forward transcribed here (the
fix_query_key_value_ordering split, nn.Conv1d over the sequence,
torch_chunk_gated_delta_rule at chunk sizes 64 and 5, Qwen3NextRMSNormGated),
and against its cached decode (torch_causal_conv1d_update and
torch_recurrent_gated_delta_rule after a chunked prefill); the two rules
against each other and the reference's; the sparse MoE against every expert
on every token weighted by gates that are zero outside the top k (with and
without norm_topk_prob); the partial rotary against Qwen3NextRotaryEmbedding's
tables and apply_rotary_pos_emb; the attention against its eager forward; the
whole model against the layers transcribed, against token-by-token steps, a
split sequence and batches of single rows; how Config reads layer_types,
rope_parameters and the MoE layers, and what it refuses; save -> load round
trips with the per-expert and fused expert names (identical logits).
Exits non-zero on a mismatch.
Run: /usr/bin/python3 tests/python/qwen3_next_reference_test.py
"""

import os
import sys
import tempfile

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


def expect(name, condition):
    print(f"{'ok  ' if condition else 'FAIL'} {name}")
    if not condition:
        FAILED.append(name)


def refused(name, config):
    try:
        R.Config(config)
    except ValueError as e:
        print(f"ok   refused {name}: {e}")
        return
    print(f"FAIL {name} was not refused")
    FAILED.append(f"refuse {name}")


BASE = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 3,
        "vocab_size": 300, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25, "intermediate_size": 96,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"]}


# ---- transformers' torch paths (modeling_qwen3_next.py), transcribed


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_rule(query, key, value, g, beta, chunk_size, initial_state=None):
    """torch_chunk_gated_delta_rule(use_qk_l2norm_in_kernel=True): inputs
    (B, T, H, d) and (B, T, H) -> output (B, T, H, dv), final state."""
    query, key = l2norm(query), l2norm(key)
    query, key, value, beta, g = [t.transpose(1, 2).contiguous()
                                  for t in (query, key, value, beta, g)]
    B, H, T, dk = key.shape
    dv = value.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    query, key, value = [F.pad(t, (0, 0, 0, pad)) for t in (query, key, value)]
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    n = (T + pad) // chunk_size
    query = query * (1 / dk ** 0.5)
    v_beta = value * beta[..., None]
    k_beta = key * beta[..., None]
    query, key, value, k_beta, v_beta = [t.reshape(B, H, n, chunk_size, t.shape[-1])
                                         for t in (query, key, value, k_beta, v_beta)]
    g = g.reshape(B, H, n, chunk_size).cumsum(dim=-1)
    on_and_above = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=0)
    decay_mask = (g[..., :, None] - g[..., None, :]).tril().exp().tril()
    attn = -((k_beta @ key.transpose(-1, -2)) * decay_mask).masked_fill(on_and_above, 0)
    for i in range(1, chunk_size):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + torch.eye(chunk_size)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp()[..., None])
    state = (torch.zeros(B, H, dk, dv) if initial_state is None else initial_state)
    out = torch.zeros_like(value)
    above = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=1)
    for i in range(n):
        q_i, k_i, v_i = query[:, :, i], key[:, :, i], value[:, :, i]
        a = (q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]).masked_fill(above, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ state
        out[:, :, i] = (q_i * g[:, :, i, :, None].exp()) @ state + a @ v_new
        state = (state * g[:, :, i, -1, None, None].exp() +
                 (k_i * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2)
                 @ v_new)
    out = out.reshape(B, H, -1, dv)[:, :, :T]
    return out.transpose(1, 2).contiguous(), state


def recurrent_rule(query, key, value, g, beta, initial_state=None):
    """torch_recurrent_gated_delta_rule(use_qk_l2norm_in_kernel=True)."""
    query, key = l2norm(query), l2norm(key)
    query, key, value, beta, g = [t.transpose(1, 2).contiguous()
                                  for t in (query, key, value, beta, g)]
    B, H, T, dk = key.shape
    dv = value.shape[-1]
    query = query * (1 / dk ** 0.5)
    out = torch.zeros(B, H, T, dv)
    state = torch.zeros(B, H, dk, dv) if initial_state is None else initial_state
    for i in range(T):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * g[:, :, i].exp()[..., None, None]
        kv_mem = (state * k_t[..., None]).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i, None]
        state = state + k_t[..., None] * delta[..., None, :]
        out[:, :, i] = (state * q_t[..., None]).sum(dim=-2)
    return out.transpose(1, 2).contiguous(), state


def upstream_gdn(m, x, chunk_size, cache=None):
    """Qwen3NextGatedDeltaNet.forward on the torch path. cache None: no
    cache; else a dict as DynamicCache holds it for the layer (conv_state
    (B, C, K), recurrent_state): a one-token x after a previous state takes
    the cached decode path, any other x the chunked prefill from scratch
    (which writes the cache)."""
    c = m.c
    B, T, _ = x.shape
    Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv, K = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
    r = Hv // Hk
    decode = cache is not None and "recurrent_state" in cache and T == 1
    qkvz = m.in_proj_qkvz(x).view(B, T, Hk, 2 * dk + 2 * dv * Hv // Hk)
    ba = m.in_proj_ba(x).view(B, T, Hk, 2 * Hv // Hk)
    query, key, value, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=3)
    b, a = torch.split(ba, [r, r], dim=3)
    value = value.reshape(B, T, -1, dv)
    z = z.reshape(B, T, -1, dv)
    b, a = b.reshape(B, T, Hv), a.reshape(B, T, Hv)
    query, key, value = (t.reshape(B, T, -1) for t in (query, key, value))
    mixed = torch.cat((query, key, value), dim=-1).transpose(1, 2)
    if decode:
        # torch_causal_conv1d_update
        conv_state = cache["conv_state"]
        full = torch.cat([conv_state, mixed], dim=-1)
        cache["conv_state"] = full[:, :, -conv_state.shape[-1]:]
        out = F.conv1d(full, m.conv1d.weight, None, padding=0, groups=full.shape[1])
        mixed = F.silu(out[:, :, -T:])
    else:
        if cache is not None:
            cache["conv_state"] = F.pad(mixed, (K - mixed.shape[-1], 0))
        mixed = F.silu(m.conv1d(mixed)[:, :, :T])
    mixed = mixed.transpose(1, 2)
    query, key, value = torch.split(mixed, [c.linear_key_dim, c.linear_key_dim,
                                            c.linear_value_dim], dim=-1)
    query = query.reshape(B, T, -1, dk)
    key = key.reshape(B, T, -1, dk)
    value = value.reshape(B, T, -1, dv)
    beta = b.sigmoid()
    g = -m.A_log.exp() * F.softplus(a + m.dt_bias)
    if r > 1:
        query = query.repeat_interleave(r, dim=2)
        key = key.repeat_interleave(r, dim=2)
    if decode:
        o, state = recurrent_rule(query, key, value, g, beta, cache["recurrent_state"])
    else:
        o, state = chunk_rule(query, key, value, g, beta, chunk_size)
    if cache is not None:
        cache["recurrent_state"] = state
    # Qwen3NextRMSNormGated on rows of head_v_dim
    o, z = o.reshape(-1, dv), z.reshape(-1, dv)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.norm_eps)
    o = (m.norm.weight * o) * F.silu(z)
    return m.out_proj(o.reshape(B, T, -1))


def zero_centred_norm(x, weight, eps):
    """Qwen3NextRMSNorm."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def rope_tables(c, position_ids, dtype):
    """Qwen3NextRotaryEmbedding: compute_default_rope_parameters and forward
    (float32), position_ids (T,) -> cos, sin (1, T, dim)."""
    base = c.rope_theta
    dim = int(c.head_dim * c.partial_rotary_factor)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    freqs = (inv_freq[None, :, None].float() @ position_ids[None, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """q, k (B, H, T, d); cos, sin (B, T, dim) unsqueezed at 1."""
    cos, sin = cos[:, None], sin[:, None]
    n = cos.shape[-1]
    q_rot, q_pass = q[..., :n], q[..., n:]
    k_rot, k_pass = k[..., :n], k[..., n:]
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1)


def upstream_attention(m, x):
    """Qwen3NextAttention.forward, eager, a whole sequence from position 0."""
    c = m.c
    B, T, _ = x.shape
    d = c.head_dim
    query, gate = torch.chunk(m.q_proj(x).view(B, T, -1, d * 2), 2, dim=-1)
    gate = gate.reshape(B, T, -1)
    query = zero_centred_norm(query.view(B, T, -1, d), m.q_norm.weight, c.norm_eps).transpose(1, 2)
    key = zero_centred_norm(m.k_proj(x).view(B, T, -1, d), m.k_norm.weight,
                            c.norm_eps).transpose(1, 2)
    value = m.v_proj(x).view(B, T, -1, d).transpose(1, 2)
    cos, sin = rope_tables(c, torch.arange(T), x.dtype)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    n_rep = c.num_heads // c.num_kv_heads
    key = key[:, :, None].expand(B, c.num_kv_heads, n_rep, T, d).reshape(B, -1, T, d)
    value = value[:, :, None].expand(B, c.num_kv_heads, n_rep, T, d).reshape(B, -1, T, d)
    weights = torch.matmul(query, key.transpose(2, 3)) * d ** -0.5
    weights = weights + torch.full((T, T), -torch.inf).triu(1)
    weights = F.softmax(weights, dim=-1)
    out = torch.matmul(weights, value).transpose(1, 2).reshape(B, T, -1)
    return m.o_proj(out * torch.sigmoid(gate))


def mlp(m, x):
    return m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))


def dense_moe(m, x):
    """Every expert on every token, gates zero outside the top k, plus the
    gated shared expert."""
    c = m.gate.c
    probs = F.softmax(x @ m.gate.weight.t(), dim=-1)
    top, index = torch.topk(probs, c.num_experts_per_tok, dim=-1)
    if c.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    gates = torch.zeros_like(probs).scatter(-1, index, top)
    gate, up = torch.einsum("...h,eoh->...eo", x, m.experts.gate_up_proj).chunk(2, dim=-1)
    y = torch.einsum("...ei,ehi->...eh", F.silu(gate) * up, m.experts.down_proj)
    return (gates[..., None] * y).sum(-2) + torch.sigmoid(x @ m.shared_expert_gate.weight.t()) * \
        mlp(m.shared_expert, x)


def upstream_lm(model, tokens, chunk_size):
    c = model.c
    x = model.model.embed_tokens.weight[tokens]
    for i, layer in enumerate(model.model.layers):
        h = zero_centred_norm(x, layer.input_layernorm.weight, c.norm_eps)
        if c.layer_types[i] == "linear_attention":
            h = upstream_gdn(layer.linear_attn, h, chunk_size)
        else:
            h = upstream_attention(layer.self_attn, h)
        x = x + h
        h = zero_centred_norm(x, layer.post_attention_layernorm.weight, c.norm_eps)
        x = x + (dense_moe(layer.mlp, h) if c.moe_layers[i] else mlp(layer.mlp, h))
    x = zero_centred_norm(x, model.model.norm.weight, c.norm_eps)
    return x @ model.lm_head.weight.t()


# ---- the checks


def check_rules():
    torch.manual_seed(0)
    B, T, H, dk, dv = 2, 77, 3, 8, 12
    q, k = torch.randn(B, T, H, dk), torch.randn(B, T, H, dk)
    v = torch.randn(B, T, H, dv)
    g = -F.softplus(torch.randn(B, T, H) - 1) * 2
    beta = torch.rand(B, T, H)
    s0 = torch.randn(B, H, dk, dv)
    o_rec, s_rec = recurrent_rule(q, k, v, g, beta, s0.clone())
    for chunk in (64, 5, 1):
        o_chk, s_chk = chunk_rule(q, k, v, g, beta, chunk, s0.clone())
        check(f"chunk rule (chunk {chunk}, T {T}) = recurrent rule", o_chk, o_rec)
        check(f"chunk rule final state (chunk {chunk})", s_chk, s_rec)
    qr = R.l2_normalise(q) * dk ** -0.5
    o_ref, s_ref = R.gated_delta_recurrence(qr, R.l2_normalise(k), v, g, beta, s0.clone())
    check("reference recurrence = recurrent rule", o_ref, o_rec)
    check("reference recurrence final state", s_ref, s_rec)


def check_linear_layer():
    for over in ({}, {"linear_num_key_heads": 4, "linear_num_value_heads": 4,
                      "linear_key_head_dim": 8, "linear_conv_kernel_dim": 3},
                 {"linear_num_key_heads": 1, "linear_num_value_heads": 3,
                  "linear_conv_kernel_dim": 2, "linear_value_head_dim": 8},
                 {"linear_conv_kernel_dim": 1}):
        model = R.random_model({**BASE, **over}, seed=1).double()
        layer = model.model.layers[0].linear_attn
        x = torch.randn(2, 70, 64)
        with torch.no_grad():
            whole = layer(x)
            for chunk in (64, 5):
                check(f"linear layer = transformers' chunked forward (chunk {chunk}) {over}",
                      whole, upstream_gdn(layer, x, chunk))
            # transformers' cache: a chunked prefill of 9 tokens, then the
            # cached decode path one token at a time.
            cache = {}
            outs = [upstream_gdn(layer, x[:, :9], 64, cache)]
            for t in range(9, 70):
                outs.append(upstream_gdn(layer, x[:, t:t + 1], 64, cache))
            check("linear layer = transformers' prefill + cached decode", whole,
                  torch.cat(outs, 1))
            o1, st = layer.run(x[:, :23], layer.new_state(2, x.dtype))
            o2, st2 = layer.run(x[:, 23:], st)
            check("linear layer split sequence", torch.cat([o1, o2], 1), whole)
            check("linear layer state = transformers' recurrent_state", st2[0],
                  cache["recurrent_state"])
            if layer.c.linear_conv_kernel_dim > 1:
                check("linear layer window = the conv_state's last K-1 inputs", st2[1],
                      cache["conv_state"][:, :, 1:].transpose(1, 2))


def check_moe():
    for k in (1, 2, 3):
        for norm in (True, False):
            model = R.random_model({**BASE, "num_experts_per_tok": k, "norm_topk_prob": norm},
                                   seed=2).double()
            moe = model.model.layers[0].mlp
            x = torch.randn(3, 11, 64)
            with torch.no_grad():
                check(f"moe top-{k} norm_topk_prob {norm} = dense", moe(x), dense_moe(moe, x))
                probs = (x @ moe.gate.weight.t()).softmax(-1)
                used = len(set(probs.topk(k, dim=-1)[1].flatten().tolist()))
                print(f"     top-{k}: {used} of 4 experts chosen across tokens")
                if used < 2:
                    FAILED.append(f"routing does not vary (top-{k})")
                gate = torch.sigmoid(x @ moe.shared_expert_gate.weight.t())
                if gate.max() - gate.min() < 0.2:
                    FAILED.append("shared expert gate does not vary")


def check_rotary_and_attention():
    for head_dim, factor, theta in ((16, 0.25, 10000.0), (24, 0.25, 500.0), (16, 0.5, 500.0),
                                    (16, 1.0, 1e7), (24, 0.35, 10000.0)):
        c = R.Config({**BASE, "head_dim": head_dim, "partial_rotary_factor": factor,
                      "rope_theta": theta})
        for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
            x = torch.randn(1, 7, 2, head_dim, dtype=dtype)
            cos, sin = rope_tables(c, torch.arange(5, 12), dtype)
            y = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin)[0]
            check(f"partial rotary (head_dim {head_dim}, factor {factor}, theta {theta}, "
                  f"{dtype}) = transformers' tables", R.partial_rotary(x, 5, theta, c.rotary_dim),
                  y.transpose(1, 2), tol)
    for over in ({}, {"num_key_value_heads": 1, "attention_bias": True,
                      "partial_rotary_factor": 1.0},
                 {"head_dim": 24, "num_key_value_heads": 4, "rope_theta": 500.0}):
        model = R.random_model({**BASE, **over}, seed=4).double()
        attn = model.model.layers[1].self_attn
        x = torch.randn(2, 13, 64)
        with torch.no_grad():
            check(f"attention = transformers' eager forward {over}",
                  attn.run(x, attn.new_state(2, x.dtype))[0], upstream_attention(attn, x))


def check_config():
    c = R.Config({"model_type": "qwen3_next"})
    expect("defaults: Qwen3NextConfig's",
           (c.hidden_size, c.num_hidden_layers, c.vocab_size, c.num_heads, c.num_kv_heads,
            c.head_dim, c.intermediate_size,
            c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
            c.linear_value_head_dim, c.linear_conv_kernel_dim, c.num_experts,
            c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size,
            c.norm_topk_prob, c.norm_eps, c.rope_theta, c.partial_rotary_factor, c.rotary_dim,
            c.attention_bias, c.tie_word_embeddings)
           == (2048, 48, 151936, 16, 2, 256, 5632, 16, 32, 128, 128, 4, 512, 10, 512, 512,
               True, 1e-6, 10000.0, 0.25, 64, False, False))
    expect("default layer_types: every 4th layer full attention",
           c.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 12)
    expect("default: every layer MoE", all(c.moe_layers))
    c = R.Config({**BASE, "layer_types": None, "num_hidden_layers": 5,
                  "full_attention_interval": 2})
    expect("full_attention_interval 2",
           c.layer_types == ["linear_attention", "full_attention"] * 2 + ["linear_attention"])
    c = R.Config({**BASE, "layer_types": ["mamba", "attention", "linear_attention"]})
    expect("legacy layer names remapped",
           c.layer_types == ["linear_attention", "full_attention", "linear_attention"])
    c = R.Config({**BASE, "num_hidden_layers": 6, "layer_types": None,
                  "decoder_sparse_step": 2, "mlp_only_layers": [3, 9]})
    expect("decoder_sparse_step 2, mlp_only_layers [3, 9]",
           c.moe_layers == [False, True, False, False, False, True])
    c = R.Config({**BASE, "num_experts": 0, "num_experts_per_tok": 10})
    expect("num_experts 0: every layer dense", not any(c.moe_layers))

    def rope(**over):
        d = {k: v for k, v in BASE.items() if k not in ("rope_theta", "partial_rotary_factor")}
        c = R.Config({**d, **over})
        return c.rope_theta, c.partial_rotary_factor, c.rotary_dim

    expect("rope: defaults 10000, 0.25", rope() == (10000.0, 0.25, 4))
    expect("rope: top-level fields", rope(rope_theta=500, partial_rotary_factor=0.5)
           == (500.0, 0.5, 8))
    expect("rope: rope_parameters",
           rope(rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                 "partial_rotary_factor": 0.5}) == (500.0, 0.5, 8))
    expect("rope: rope_parameters win over the top-level fields",
           rope(rope_theta=1e6, partial_rotary_factor=1.0,
                rope_parameters={"rope_theta": 500.0, "partial_rotary_factor": 0.5})
           == (500.0, 0.5, 8))
    expect("rope: the top-level fields fill what rope_parameters lacks",
           rope(rope_theta=1e6, partial_rotary_factor=1.0,
                rope_parameters={"rope_type": "default"}) == (1e6, 1.0, 16))
    expect("rope: rope_scaling (legacy) replaces rope_parameters",
           rope(rope_scaling={"type": "default", "rope_theta": 42.0},
                rope_parameters={"rope_theta": 500.0, "partial_rotary_factor": 0.5})
           == (42.0, 0.25, 4))
    expect("rope: rope_scaling null", rope(rope_scaling=None, rope_theta=7.0) == (7.0, 0.25, 4))
    expect("rope: int(head_dim * factor)", rope(partial_rotary_factor=0.3) == (10000.0, 0.3, 4))

    refused("a yarn rope", {**BASE, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    refused("a linear rope_scaling", {**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}})
    refused("rope per layer type", {**BASE, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10.0}}})
    refused("an odd rotary dimension", {**BASE, "partial_rotary_factor": 0.1875})
    refused("partial_rotary_factor > 1", {**BASE, "partial_rotary_factor": 1.5})
    refused("partial_rotary_factor null", {**BASE, "partial_rotary_factor": None})
    refused("rope_theta null", {**BASE, "rope_theta": None})
    refused("hidden_act gelu", {**BASE, "hidden_act": "gelu"})
    refused("num_key_value_heads not dividing", {**BASE, "num_key_value_heads": 3})
    refused("value heads not a multiple of key heads", {**BASE, "linear_num_value_heads": 3})
    refused("top-k above num_experts", {**BASE, "num_experts_per_tok": 5})
    refused("decoder_sparse_step 0", {**BASE, "decoder_sparse_step": 0})
    refused("an unknown layer type", {**BASE, "layer_types": ["linear_attention",
                                                             "sliding_attention",
                                                             "full_attention"]})
    refused("layer_types of the wrong length", {**BASE, "layer_types": ["full_attention"]})
    refused("full_attention_interval 0", {**BASE, "layer_types": None,
                                          "full_attention_interval": 0})
    refused("head_dim null", {**BASE, "head_dim": None})
    refused("an attn field", {**BASE, "attn": {"layers": [0], "num_heads": 4}})


def check_model():
    for over in ({},
                 {"num_experts": 0, "attention_bias": True, "num_key_value_heads": 1,
                  "partial_rotary_factor": 1.0, "tie_word_embeddings": True},
                 {"num_hidden_layers": 4, "layer_types": None, "full_attention_interval": 2,
                  "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": False,
                  "num_experts_per_tok": 1},
                 {"head_dim": 24, "linear_conv_kernel_dim": 3, "linear_num_key_heads": 4,
                  "linear_num_value_heads": 4, "rope_theta": None, "partial_rotary_factor": None,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                      "partial_rotary_factor": 0.5}}):
        config = {k: v for k, v in {**BASE, **over}.items() if v is not None}
        model = R.random_model(config, seed=3).double()
        tokens = torch.randint(0, 300, (3, 70))
        with torch.no_grad():
            whole = model(tokens)
            check(f"model = transformers' layers transcribed {over}", whole,
                  upstream_lm(model, tokens, 64))
            states = model.new_state(3, torch.float64)
            steps = []
            for t in range(tokens.shape[1]):
                logits, states = model.step(tokens[:, t], states)
                steps.append(logits)
            check("forward = steps", torch.stack(steps, 1), whole)
            states = model.new_state(3, torch.float64)
            x = model.embed(tokens)
            for layer, st in zip(model.model.layers, states):
                a, st = layer.run(x[:, :31], st)
                b, _ = layer.run(x[:, 31:], st)
                x = torch.cat([a, b], 1)
            check("split sequence", model.head(model.model.norm(x)), whole)
            check("batch = rows", torch.cat([model(tokens[i:i + 1]) for i in range(3)]), whole)


def expected_names(c):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not c.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        if c.layer_types[i] == "linear_attention":
            names |= {p + "linear_attn." + n for n in (
                "in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "dt_bias", "A_log",
                "norm.weight", "out_proj.weight")}
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names.add(f"{p}self_attn.{proj}.weight")
                if c.attention_bias:
                    names.add(f"{p}self_attn.{proj}.bias")
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        if c.moe_layers[i]:
            names |= {p + "mlp.gate.weight", p + "mlp.shared_expert_gate.weight"}
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names.add(f"{p}mlp.shared_expert.{proj}.weight")
                for e in range(c.num_experts):
                    names.add(f"{p}mlp.experts.{e}.{proj}.weight")
        else:
            names |= {f"{p}mlp.{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj")}
    return names


def check_save_load():
    for over in ({}, {"num_hidden_layers": 4, "layer_types": None, "full_attention_interval": 2,
                      "decoder_sparse_step": 2, "attention_bias": True,
                      "tie_word_embeddings": True}):
        model = R.random_model({**BASE, **over}, seed=5).float()
        c = model.c
        tokens = torch.randint(0, 300, (1, 20))
        with torch.no_grad():
            logits = model(tokens)
        with tempfile.TemporaryDirectory() as tmp:
            split, fused, bf16 = (os.path.join(tmp, n) for n in ("split", "fused", "bf16"))
            R.save_model(model, split)
            R.save_model(model, fused, experts="fused")
            R.save_model(model, bf16, "BF16")
            names = set(R.read_safetensors(os.path.join(split, "model.safetensors")))
            expect(f"per-expert file: the Hub's tensor names {over}", names == expected_names(c))
            if names != expected_names(c):
                print("     extra:", sorted(names - expected_names(c))[:5],
                      "missing:", sorted(expected_names(c) - names)[:5])
            ft = R.read_safetensors(os.path.join(fused, "model.safetensors"))
            moe = [i for i, m in enumerate(c.moe_layers) if m]
            p = f"model.layers.{moe[0]}.mlp.experts."
            expect("fused file: gate_up_proj (E, 2I, H) and down_proj (E, H, I)",
                   ft[p + "gate_up_proj"].shape == (4, 64, 64) and
                   ft[p + "down_proj"].shape == (4, 64, 32) and
                   not any(".experts.0." in n for n in ft))
            st = R.read_safetensors(os.path.join(split, "model.safetensors"))
            expect("fused gate rows first = the per-expert gate_proj",
                   (ft[p + "gate_up_proj"][1, :32] == st[p + "1.gate_proj.weight"]).all() and
                   (ft[p + "gate_up_proj"][1, 32:] == st[p + "1.up_proj.weight"]).all() and
                   (ft[p + "down_proj"][2] == st[p + "2.down_proj.weight"]).all())
            with torch.no_grad():
                a = R.load_model(split)(tokens)
                b = R.load_model(fused)(tokens)
                expect("per-expert file -> load: identical logits", torch.equal(a, logits))
                expect("fused file -> load: identical logits", torch.equal(b, logits))
                # BF16: the weights rounded to bfloat16 in memory (the
                # router's top k may flip, so not merely close to logits).
                rounded = R.random_model({**BASE, **over}, seed=5).float()
                for q in rounded.parameters():
                    q.copy_(q.to(torch.bfloat16).float())
                check("BF16 file -> load = the weights rounded to bfloat16",
                      R.load_model(bf16)(tokens), rounded(tokens), 0)
    model = R.random_model(BASE, seed=6)
    names = {n for n, _ in model.named_parameters()}
    zero = [p for n, p in model.named_parameters()
            if n.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))
            or n == "model.norm.weight"]
    gated = [p for n, p in model.named_parameters() if n.endswith("linear_attn.norm.weight")]
    expect("random: zero-centred norm weights near 0, the gated norm's near 1",
           all(p.abs().mean() < 0.3 for p in zero) and
           all((p - 1).abs().mean() < 0.3 for p in gated) and
           "model.layers.0.mlp.experts.gate_up_proj" in names)


def main():
    torch.manual_seed(0)
    check_rules()
    check_linear_layer()
    check_moe()
    check_rotary_and_attention()
    check_config()
    check_model()
    check_save_load()
    if FAILED:
        print("FAILED:", ", ".join(FAILED))
        sys.exit(1)
    print("all qwen3_next reference checks passed")


if __name__ == "__main__":
    main()
