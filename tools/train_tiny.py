#!/usr/bin/python3
"""Trains linattn's built-in model and exports it in the fla layout.

The model: fla's `gated_deltanet` (the gated delta rule of the Qwen3-Next
line) with a SentencePiece unigram vocabulary of 4,096 pieces (byte fallback)
trained first on the same text: 4 layers, hidden 256, 4 heads of 64 (keys and
values), short convolutions of 4 taps, output gate, SwiGLU MLP of 768,
untied embeddings. Architecture and export come from
linattn_ref.py beside this file; training runs the same model through the
chunkwise form below (gated_delta_chunked), which tests/python/
train_tiny_test.py holds to linattn_ref's token-by-token recurrence.

With --type rwkv7, the RWKV-7 model shipped beside it (models/tiny-rwkv7):
fla's `rwkv7` at the same size (heads of 64, ReLU² channel mix of 1024),
fla's initialisation (initialise_rwkv7), trained the same way on the same
text with the same vocabulary; its state update runs in the chunkwise form
dplr_chunked, held to linattn_ref's recurrence by the same test.

The text: the King James Version of the Bible (1611, public domain), read
with the `bible` program of Debian's bible-kjv / bible-kjv-text packages.
Verses are printed without their references, one per line. The last 2% of
verses are held out for the validation loss.

Deterministic on a given CPU: fixed seeds, fixed step count, a fixed thread
count (the products run in bf16 where the CPU multiplies bf16 natively, in
fp32 elsewhere, unless --matmul says which).

    /usr/bin/python3 tools/train_tiny.py --out models/tiny
    /usr/bin/python3 tools/train_tiny.py --evaluate models/tiny   (held-out loss of an export)
    /usr/bin/python3 tools/train_tiny.py --held-out-text FILE     (the held-out text, as evaluated)
    /usr/bin/python3 tools/train_tiny.py --type rwkv7 --out models/tiny-rwkv7 --chunk 16
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import linattn_ref  # noqa: E402  (first: it sets up OpenBLAS before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.nn.init as nn_init  # noqa: E402

CONFIG = {
    "model_type": "gated_deltanet",
    "attn_mode": "chunk",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_heads": 4,
    "num_v_heads": None,
    "head_dim": 64,
    "expand_v": 1,
    "use_gate": True,
    "use_short_conv": True,
    "conv_size": 4,
    "allow_neg_eigval": False,
    "hidden_act": "swish",
    "hidden_ratio": 4,
    "intermediate_size": None,
    "norm_eps": 1e-6,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "max_position_embeddings": 2048,
}

# The RWKV-7 model trained beside it (--type rwkv7): fla's `rwkv7` at the same
# size (4 layers, hidden 256, heads of 64, channel mix of 1024), the low-rank
# sizes fla's defaults give at hidden 256, untied embeddings.
RWKV7_CONFIG = {
    "model_type": "rwkv7",
    "attn_mode": "chunk",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "head_dim": 64,
    "num_heads": 4,
    "decay_low_rank_dim": 32,
    "gate_low_rank_dim": 64,
    "a_low_rank_dim": 32,
    "v_low_rank_dim": 32,
    "hidden_act": "sqrelu",
    "hidden_ratio": 4,
    "intermediate_size": 1024,
    "norm_first": True,
    "norm_bias": True,
    "norm_eps": 1e-5,
    "fuse_norm": True,
    "value_dim": None,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "max_position_embeddings": 2048,
}
CONFIGS = {"gated_deltanet": CONFIG, "rwkv7": RWKV7_CONFIG}


def conv_whole(conv, x):
    """linattn_ref.ShortConvolution over whole sequences from an empty cache,
    as one depthwise Conv1d: x (B, T, C) -> (B, T, C)."""
    w = conv.weight  # (C, 1, W)
    y = F.conv1d(x.transpose(1, 2), w, padding=w.shape[-1] - 1, groups=w.shape[0])
    y = y[..., :x.shape[1]].transpose(1, 2)
    return F.silu(y) if conv.silu else y


def gated_delta_chunked(q, k, v, g, beta, chunk=64):
    """The gated delta rule of linattn_ref.gated_delta_recurrence from a zero
    state, a chunk of C tokens at a time: q, k (B, T, H, K) prepared, v
    (B, T, H, V), g and beta (B, T, H), T a multiple of C -> o (B, T, H, V).

    In a chunk starting from state S0, with b_t = sum of g up to t (in the
    chunk), gamma_t = exp(b_t) and Gamma[t, j] = exp(b_t - b_j) for j <= t,
    the recurrence unrolls to
        S_t = gamma_t S0 + sum_{j<=t} Gamma[t, j] k_j u_j^T
        u_t = beta_t (v_t - gamma_t S0^T k_t - sum_{j<t} Gamma[t, j] (k_t.k_j) u_j)
        o_t = gamma_t S0^T q_t + sum_{j<=t} Gamma[t, j] (q_t.k_j) u_j
    so (I + A) U = diag(beta) V - diag(beta gamma) K S0 with A[t, j] =
    beta_t Gamma[t, j] (k_t.k_j) strictly below the diagonal: per chunk one
    unit lower triangular matrix, solved for U0 = (I+A)^-1 diag(beta) V and
    W = (I+A)^-1 diag(beta gamma) K, then U = U0 - W S0 chunk after chunk.
    Every exponent is of a sum of g <= 0 over a span: no factor exceeds 1.
    Runs in float32 at least, whatever autocast gave the projections."""
    with torch.autocast("cpu", enabled=False):
        wide = [x.to(torch.promote_types(x.dtype, torch.float32)) for x in (q, k, v, g, beta)]
        return _gated_delta_chunked(*wide, chunk)


def _gated_delta_chunked(q, k, v, g, beta, chunk):
    B, T, H, K = k.shape
    V = v.shape[-1]
    n = T // chunk

    def split(x):  # (B, T, H, ...) -> (B, H, n, C, ...)
        return x.transpose(1, 2).reshape(B, H, n, chunk, *x.shape[3:])

    q, k, v = split(q), split(k), split(v)
    g, beta = split(g[..., None])[..., 0], split(beta[..., None])[..., 0]
    b = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    strict = lower.tril(-1)
    gamma_tj = torch.where(lower, b[..., :, None] - b[..., None, :],
                           torch.full_like(b[..., None], -math.inf)).exp()
    a = (beta[..., None] * (k @ k.transpose(-1, -2)) * gamma_tj).masked_fill(~strict, 0)
    eye = torch.eye(chunk, dtype=q.dtype)
    u0 = torch.linalg.solve_triangular(eye + a, beta[..., None] * v, upper=False,
                                       unitriangular=True)
    w = torch.linalg.solve_triangular(eye + a, (beta * b.exp())[..., None] * k, upper=False,
                                      unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * gamma_tj
    s = q.new_zeros(B, H, K, V)
    outs = []
    for i in range(n):
        u = u0[:, :, i] - w[:, :, i] @ s
        outs.append(b[:, :, i, :, None].exp() * (q[:, :, i] @ s) + qk[:, :, i] @ u)
        last = b[:, :, i, -1:]
        s = last[..., None].exp() * s + \
            ((last - b[:, :, i]).exp()[..., None] * k[:, :, i]).transpose(-1, -2) @ u
    return torch.stack(outs, 2).reshape(B, H, T, V).transpose(1, 2)


def gated_deltanet_whole(attn, x, chunk):
    """linattn_ref.GatedDeltaNet.run over whole sequences from an empty state
    (num_v_heads = num_heads), with the convolutions and the recurrence in
    their parallel forms."""
    c = attn.c
    assert c.num_v_heads == c.num_heads and not c.allow_neg_eigval, "not this training form"
    q = conv_whole(attn.q_conv1d, attn.q_proj(x)).unflatten(-1, (c.num_heads, c.head_k_dim))
    k = conv_whole(attn.k_conv1d, attn.k_proj(x)).unflatten(-1, (c.num_heads, c.head_k_dim))
    v = conv_whole(attn.v_conv1d, attn.v_proj(x)).unflatten(-1, (c.num_v_heads, c.head_v_dim))
    beta = attn.b_proj(x).sigmoid()
    g = -attn.A_log.exp() * F.softplus(attn.a_proj(x) + attn.dt_bias)
    q = linattn_ref.l2_normalise(q) * c.head_k_dim ** -0.5
    k = linattn_ref.l2_normalise(k)
    return attn.finish(gated_delta_chunked(q, k, v, g, beta, chunk), x)


def dplr_chunked(q, k, v, alpha, beta, gk, s, chunk):
    """linattn_ref.dplr_recurrence (RWKV-7's state update) a chunk of C
    tokens at a time: q, k, alpha, beta, gk (B, T, H, K), v (B, T, H, V), s
    (B, H, K, V), T a multiple of C -> (o (B, T, H, V), the last state).

    The recurrence is S_t = (D_t + beta_t alpha_t^T) S_{t-1} + k_t v_t^T,
    D_t = diag(exp(gk_t)), o_t = S_t^T q_t. In a chunk from S0, with L_t the
    sum of gk up to t and L_0 = 0, and u_t = alpha_t^T S_{t-1} (a row):
        S_t = e^{L_t} S0 + sum_{j<=t} e^{L_t - L_j} (beta_j u_j + k_j v_j^T)
        u_t = (alpha_t e^{L_{t-1}})^T S0
              + sum_{j<t} (alpha_t e^{L_{t-1}-L_j}).(beta_j u_j + k_j v_j^T)
    (exponentials of vectors scale the rows), so (I - A) U = W0 S0 + B V
    with A[t, j] = (alpha_t e^{L_{t-1}-L_j}).beta_j and B[t, j] =
    (alpha_t e^{L_{t-1}-L_j}).k_j below the diagonal: one unit lower
    triangular solve per chunk, then U = W S0 + U0 chunk after chunk. gk
    >= -0.607 per token (RWKV-7's decay), so over 16 tokens no factor
    e^{-L} exceeds e^{9.8}. Runs in float32 whatever autocast gave it."""
    with torch.autocast("cpu", enabled=False):
        wide = [x.to(torch.promote_types(x.dtype, torch.float32))
                for x in (q, k, v, alpha, beta, gk, s)]
        return _dplr_chunked(*wide, chunk)


def _dplr_chunked(q, k, v, alpha, beta, gk, s, chunk):
    B, T, H, K = k.shape
    V = v.shape[-1]
    n = T // chunk

    def split(x):  # (B, T, H, D) -> (B, H, n, C, D)
        return x.transpose(1, 2).reshape(B, H, n, chunk, x.shape[-1])

    q, k, v, alpha, beta, gk = map(split, (q, k, v, alpha, beta, gk))
    lam = gk.cumsum(-2)
    last = lam[..., -1:, :]
    qd, ad = q * lam.exp(), alpha * (lam - gk).exp()
    bd, kd = beta * (-lam).exp(), k * (-lam).exp()
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    lower = strict | torch.eye(chunk, dtype=torch.bool)
    a_b = (ad @ bd.transpose(-1, -2)).masked_fill(~strict, 0)
    a_k = (ad @ kd.transpose(-1, -2)).masked_fill(~strict, 0)
    q_b = (qd @ bd.transpose(-1, -2)).masked_fill(~lower, 0)
    q_k = (qd @ kd.transpose(-1, -2)).masked_fill(~lower, 0)
    m = torch.eye(chunk, dtype=q.dtype) - a_b
    w = torch.linalg.solve_triangular(m, ad, upper=False, unitriangular=True)
    u0 = torch.linalg.solve_triangular(m, a_k @ v, upper=False, unitriangular=True)
    to_end = (last - lam).exp()
    bc, kc = (beta * to_end).transpose(-1, -2), (k * to_end).transpose(-1, -2)
    decay = last.exp().transpose(-1, -2)  # (B, H, n, K, 1)
    outs = []
    for i in range(n):
        u = w[:, :, i] @ s + u0[:, :, i]
        vi = v[:, :, i]
        outs.append(qd[:, :, i] @ s + q_b[:, :, i] @ u + q_k[:, :, i] @ vi)
        s = decay[:, :, i] * s + bc[:, :, i] @ u + kc[:, :, i] @ vi
    return torch.stack(outs, 2).reshape(B, H, T, V).transpose(1, 2), s


def forward_whole(model, tokens, chunk=64):
    """model(tokens) for a gated_deltanet or rwkv7 linattn_ref model, T a
    multiple of chunk: the same logits, fast enough to train on."""
    if model.c.model_type == "rwkv7":
        layers = model.parts()[1]
        for layer in layers:
            layer.attn.recurrence = lambda *a: dplr_chunked(*a, chunk)
        try:
            return model(tokens)
        finally:
            for layer in layers:
                del layer.attn.recurrence
    embeddings, layers, norm = model.parts()
    x = embeddings(tokens)
    for layer in layers:
        x = x + gated_deltanet_whole(layer.attn, layer.attn_norm(x), chunk)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(norm(x))


def initialise(model, seed):
    """GPT-2's init for the projections (N(0, 0.02), output projections
    scaled by depth), fla's for the decay: A ~ U(1, 16), dt ~ logU(1e-3,
    0.1) through the softplus inverse."""
    gen = torch.Generator().manual_seed(seed)
    layers = model.c.num_hidden_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith(".dt_bias"):
                lo, hi = math.log(1e-3), math.log(0.1)
                dt = torch.exp(torch.rand(p.shape, generator=gen) * (hi - lo) + lo)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.mul_(1 / math.sqrt(2 * layers))


def initialise_rwkv7(model, seed):
    """fla's initialisation of RWKV7ForCausalLM (RWKV7Attention,
    RWKV7FeedForward and LoRA._initialize_weights, RWKV7PreTrainedModel.
    _init_weights), itself BlinkDL's: token-shift mixes and decay biases by
    channel and depth, orthogonal r/k/v and channel-mix keys, zero output
    projections, tiny embeddings, an orthogonal head of gain
    0.5 sqrt(vocab / hidden)."""
    torch.manual_seed(seed)
    c = model.c
    h, layers, dk = c.hidden_size, c.num_hidden_layers, c.head_dim
    n = torch.arange(h, dtype=torch.float32)
    ddd = n / h
    linear = n / (h - 1) - 0.5
    zigzag = ((n % dk) - (dk - 1) / 2) / ((dk - 1) / 2)
    zigzag = zigzag * zigzag.abs()

    def lora(m, bias=None):
        nn_init.zeros_(m.lora[0].weight)
        rows, cols = m.lora[2].weight.shape
        nn_init.orthogonal_(m.lora[2].weight, gain=(math.sqrt(cols / rows) if cols > rows else 1) * 0.1)
        if m.lora[2].bias is not None:
            m.lora[2].bias.copy_(bias if bias is not None else torch.zeros(rows))

    embeddings, blocks, _ = model.parts()
    with torch.no_grad():
        nn_init.uniform_(embeddings.weight, -1e-4, 1e-4)
        gain = 0.5 * math.sqrt(c.vocab_size / h) if c.vocab_size > h else 0.5
        nn_init.orthogonal_(model.lm_head.weight, gain=gain)
        for i, block in enumerate(blocks):
            at, ffn = block.attn, block.ffn
            r01, r10 = i / (layers - 1), 1.0 - i / layers
            for name, e in (("x_r", 0.2), ("x_w", 0.9), ("x_k", 0.7), ("x_v", 0.7), ("x_a", 0.9),
                            ("x_g", 0.2)):
                getattr(at, name).copy_((1.0 - ddd ** (e * r10)).view(1, 1, h))
            at.k_a.fill_(1.02)
            at.r_k.fill_(-0.04)
            at.k_k.copy_(0.71 - linear * 0.1)
            www = -6 + 6 * (n / (h - 1)) ** (1 + r01 ** 0.3)
            lora(at.w_lora, www + 0.5 + zigzag * 2.5)
            lora(at.a_lora, -0.19 + zigzag * 0.3 + linear * 0.4)
            lora(at.g_lora)
            if i != 0:
                lora(at.v_lora, 0.73 - linear * 0.4)
            at.g_norm.weight.fill_(((i + 1) / layers) ** 0.7)
            at.g_norm.bias.zero_()
            nn_init.orthogonal_(at.r_proj.weight)
            nn_init.orthogonal_(at.k_proj.weight, gain=0.1)
            nn_init.orthogonal_(at.v_proj.weight)
            at.o_proj.weight.zero_()
            ffn.x_k.copy_(1.0 - ddd ** (r10 ** 4))
            nn_init.orthogonal_(ffn.key.weight)
            ffn.value.weight.zero_()


def kjv_text():
    """The whole KJV, one verse per line, from Debian's `bible` program."""
    out = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"],
                         capture_output=True, check=True).stdout.decode("latin-1")
    lines = []
    for line in out.splitlines():
        m = re.match(r"^\S+\d+:\d+ (.*)$", line)
        if m:
            lines.append(m.group(1).strip())
    if len(lines) < 30000:
        raise SystemExit(f"expected the whole KJV (31102 verses), got {len(lines)} lines")
    return lines


def train_tokenizer(verses, vocab_size):
    """A SentencePiece unigram vocabulary trained on the verses (one sentence
    each): text kept as it is (identity normalisation), every byte reachable
    (byte_fallback: no input is unknown), no bos/eos. Returns the serialised
    model (tokenizer.model); the same verses give the same bytes."""
    import io
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(verses), model_writer=out, vocab_size=vocab_size,
        model_type="unigram", byte_fallback=True, normalization_rule_name="identity",
        character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        num_threads=1, minloglevel=2)
    return out.getvalue()


def piece_bytes(sp):
    """How many bytes of text each id stands for (what linattn's decoder
    emits: '▁' is a space, <0xNN> one byte)."""
    sizes = []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):
            sizes.append(1)
        elif sp.is_unknown(i) or sp.is_control(i):
            sizes.append(0)
        else:
            sizes.append(len(piece.replace("\u2581", " ").encode("utf-8")))
    return np.array(sizes, dtype=np.int64)


def held_out_loss(model, valid, sizes, seq, chunk):
    """Nats per byte over the held-out tokens: the loss summed over every
    predicted token of consecutive windows of seq tokens (from an empty
    state), divided by the bytes those tokens stand for."""
    model.eval()
    nats, nbytes = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(valid) - seq, seq):
            x = torch.from_numpy(valid[s:s + seq + 1])[None]
            logits = forward_whole(model, x[:, :-1], chunk)
            nats += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
            nbytes += int(sizes[valid[s + 1:s + seq + 1]].sum())
    model.train()
    return nats / nbytes


def text_split():
    """The training and held-out verses: the last 2% are held out."""
    verses = kjv_text()
    split = int(len(verses) * 0.98)
    return verses[:split], verses[split:]


def evaluate(model_dir, seq, chunk):
    """The held-out loss of an exported model as it is stored (BF16
    weights), with its own tokenizer.model."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "tokenizer.model"))
    _, held_out = text_split()
    valid = np.array(sp.encode("\n".join(held_out)), dtype=np.int64)
    model = linattn_ref.load_model(model_dir)
    return held_out_loss(model, valid, piece_bytes(sp), seq, chunk)


def native_bf16():
    """Whether this CPU multiplies bf16 natively (what makes autocast pay)."""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return any(flag in flags for flag in (" avx512_bf16", " amx_bf16"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--type", default="gated_deltanet", choices=sorted(CONFIGS),
                   help="the model type to train (rwkv7: the RWKV-7 model shipped beside the "
                        "built-in one, trained with --out models/tiny-rwkv7 --chunk 16)")
    p.add_argument("--out", default="models/tiny")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256, help="tokens per training sequence")
    p.add_argument("--chunk", type=int, default=32, help="chunk of the chunkwise form")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--vocab", type=int, default=4096, help="SentencePiece vocabulary size")
    p.add_argument("--seed", type=int, default=1611)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--matmul", default="auto", choices=["auto", "bf16", "fp32"],
                   help="precision of the projections' products (autocast; weights, optimiser "
                        "state and the delta rule stay fp32); auto: bf16 where oneDNN has "
                        "native bf16 (AVX512_BF16 or AMX), else fp32")
    p.add_argument("--dtype", default="BF16", choices=["F32", "F16", "BF16"],
                   help="tensor dtype of the export")
    p.add_argument("--evaluate", metavar="DIR",
                   help="print the held-out loss of the model exported in DIR and stop")
    p.add_argument("--held-out-text", metavar="FILE",
                   help="write the held-out text (the verses --evaluate encodes) to FILE and stop")
    args = p.parse_args()
    if args.held_out_text:
        with open(args.held_out_text, "w", encoding="utf-8") as f:
            f.write("\n".join(text_split()[1]))
        return
    if args.seq % args.chunk:
        p.error("--seq must be a multiple of --chunk")
    if args.evaluate:
        torch.set_num_threads(args.threads)
        vl = evaluate(args.evaluate, args.seq, args.chunk)
        print(json.dumps({"model": args.evaluate, "validation_loss_nats_per_byte": round(vl, 4),
                          "validation_bits_per_byte": round(vl / math.log(2), 4)}))
        return

    import sentencepiece as spm
    if args.matmul == "auto":
        args.matmul = "bf16" if native_bf16() else "fp32"
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.matmul == "bf16")
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    training, held_out = text_split()
    tokenizer = train_tokenizer(training, args.vocab)
    sp = spm.SentencePieceProcessor(model_proto=tokenizer)
    sizes = piece_bytes(sp)
    # Encoded as linattn encodes a prompt: the whole text at once.
    train = np.array(sp.encode("\n".join(training)), dtype=np.int64)
    valid = np.array(sp.encode("\n".join(held_out)), dtype=np.int64)
    print(f"text: {len(training) + len(held_out)} verses; {len(train)} training tokens "
          f"({sizes[train].sum() / len(train):.2f} bytes each), {len(valid)} validation tokens; "
          f"tokenizer {time.time() - t0:.0f} s", flush=True)

    config = dict(CONFIGS[args.type], vocab_size=sp.get_piece_size())
    model = linattn_ref.new_model(linattn_ref.Config(config))
    if args.type == "rwkv7":
        initialise_rwkv7(model, args.seed)
        # BlinkDL's and fla's RWKV-7 training decays the matrices only: the
        # token-shift mixes, biases and norms keep their initial shapes.
        groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    else:
        initialise(model, args.seed)
        groups = [{"params": list(model.parameters()), "weight_decay": 0.1}]
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.type}, {params} parameters; {args.matmul} products", flush=True)

    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng(args.seed)

    def batch_of(data, n):
        starts = rng.integers(0, len(data) - args.seq - 1, n)
        x = torch.from_numpy(np.stack([data[s:s + args.seq + 1] for s in starts]))
        return x[:, :-1], x[:, 1:]

    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / args.warmup, 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch_of(train, args.batch)
        with autocast:
            logits = forward_whole(model, x, args.chunk)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps:
            per_byte = loss.item() * y.numel() / sizes[y.numpy()].sum()
            print(f"step {step:5d}  loss {loss.item():.4f} nats/token ({per_byte:.3f} nats/byte)"
                  f"  lr {lr:.2e}  {time.time() - t0:.0f} s", flush=True)
    vl = held_out_loss(model, valid, sizes, args.seq, args.chunk)
    elapsed = time.time() - t0
    print(f"validation loss {vl:.4f} nats/byte ({vl / math.log(2):.3f} bits/byte), {elapsed:.0f} s")

    model.c.raw = config
    linattn_ref.save_model(model, args.out, args.dtype)
    with open(os.path.join(args.out, "tokenizer.model"), "wb") as f:
        f.write(tokenizer)
    info = {
        "text": "King James Version of the Bible (public domain), Debian packages bible-kjv and "
                "bible-kjv-text, last 2% of verses held out",
        "tokenizer": f"SentencePiece unigram, {sp.get_piece_size()} pieces with byte fallback, "
                     "trained on the training verses",
        "model_type": args.type, "steps": args.steps, "batch": args.batch, "seq_tokens": args.seq, "chunk": args.chunk,
        "lr": args.lr, "warmup": args.warmup, "matmul": args.matmul, "seed": args.seed, "threads": args.threads,
        "parameters": params, "train_tokens": int(len(train)),
        "seconds": round(elapsed), "validation_loss_nats_per_byte": round(vl, 4),
        "validation_bits_per_byte": round(vl / math.log(2), 4), "export_dtype": args.dtype,
        "torch": torch.__version__, "sentencepiece": spm.__version__,
    }
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
