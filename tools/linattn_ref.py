#!/usr/bin/python3
"""PyTorch reference of flash-linear-attention language models: `linear_attn`,
`retnet`, `gla`, `delta_net`, `gated_deltanet`, `mamba2`, `rwkv7` and `rwkv6`;
and of transformers' `granitemoehybrid` (IBM Granite 4.0-H) and `qwen3_next`
(Qwen3-Next).

Written from the architecture's definition, independently of linattn's C++
code, so that the two can be compared: the C++ forward must give the logits
this file gives (tests/model/), and bench/ times this file's decode against
linattn's. Needs only Debian's python3-torch and python3-numpy.

Architecture (fla LinearAttentionForCausalLM, one block per layer):
    x = embeddings[tokens]
    per layer:  h = x + o_proj(headnorm(linattn(phi(q), phi(k), v)))   q,k,v = proj(rmsnorm(x))
                x = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h)))
    logits = lm_head(rmsnorm(x))
with linattn the causal linear attention (current token included), q scaled by
d_phi^-1/2, normalised  y = s*q.S / (s*q.z + 1e-10)  or unnormalised  s*q.S.

gated_deltanet (fla GatedDeltaNetForCausalLM) has the same block with the token
mixer of fla/layers/gated_deltanet.py and its kernel
fla/ops/gated_delta_rule/fused_recurrent.py: q, k, v through causal depthwise
convolutions of conv_size taps and SiLU; per value head, g = -exp(A_log) *
softplus(a_proj(x) + dt_bias), beta = sigmoid(b_proj(x)) (x2 with
allow_neg_eigval); q and k L2-normalised (eps 1e-6), q scaled by head_dim^-1/2;
    S = exp(g) S;  u = beta (v - S^T k);  S = S + k u^T;  o = S^T q
value head hv reading q/k head hv // (num_v_heads / num_heads); then
RMSNorm(o) * silu(g_proj(x)) per head (one weight for all heads) and o_proj.

retnet (fla RetNetForCausalLM, fla/layers/multiscale_retention.py): q, k, v
projections (k, v per key/value head), an optional feature map, rotary on q
and k at absolute positions (base 10000, GPT-NeoX halves, tables in float32),
per head S = gamma_h S + k v^T with gamma_h = 1 - 2^(-5-h) in float32, read
with q head_k_dim^-1/2; the output as gla's. hidden_ratio defaults to 2.

gla (fla GLAForCausalLM, fla/layers/gla.py): q, k, v projections (k and v
per key/value head, query head j reading head j // (num_heads/num_kv_heads)),
optional short convolutions with SiLU; a low-rank gate per key channel
gk = logsigmoid(W1 W0 x + b1) / 16 (clamped below at clamp_min), computed from
x itself; an optional feature map on q and k after it;
    S = diag(exp(gk)) S + k v^T;  o = (q head_k_dim^-1/2) S
then RMSNorm per head times silu(g_proj(x)) (use_output_gate) and o_proj.

mamba2 (fla Mamba2ForCausalLM, fla/models/mamba2, fla/layers/mamba2.py) has
its own skeleton: backbone.embeddings, per layer x = x + mixer(RMSNorm(x)) (no
MLP), backbone.norm_f, lm_head. The mixer: in_proj(x) split [z | x B C | dt];
x B C through one causal depthwise convolution (with bias) and SiLU; per head
h (group g = h // (num_heads/n_groups), as mamba_ssm and fla's decode path
read it), dt = clamp(softplus(dt + dt_bias), dt_limit), A = -exp(A_log):
    S = exp(dt A) S + dt x_h B_g^T;  y_h = S C_g + D x_h
then RMSNorm over groups of I/n_groups channels of y*silu(z) (norm_before_gate
false) or of y, times silu(z) after (true), or y*silu(z) without rmsnorm; and
out_proj. fla's own CPU prefill tiles B and C over heads (head h reads group
h % n_groups); with n_groups > 1 that disagrees with its decode and with
mamba_ssm, and this reference follows the latter.

delta_net (fla DeltaNetForCausalLM, fla/layers/delta_net.py) is the same
without a gate (g = 0): q and k through the convolution with SiLU only for
qk_activation 'silu' (relu, elu+1 or identity after it otherwise), v always
with SiLU; qk_norm 'l2' (eps 1e-6 on the sum of squares) or 'sum' (x / sum x);
beta = sigmoid(b_proj(x)) or 1 (use_beta), x2 with allow_neg_eigval; q scaled
by head_k_dim^-1/2; output RMSNorm per head, times silu(g_proj(x)) with use_gate.

rwkv7 (fla RWKV7ForCausalLM, fla/models/rwkv7, fla/layers/rwkv7.py) has its own
block: LayerNorms with bias (norm_bias), the first layer's input through
pre_norm (norm_first); per layer  x = x + time_mix(attn_norm(x)),
x = x + value(relu(key(mix(ffn_norm(x))))^2). Both mixes take the token shift
delta = x_{t-1} - x_t (the previous token's normed row is the session's state;
zeros before the first) and mix y = x + delta * x_*. The time mix, per head of
head_dim keys and value_dim / num_heads values: r, k, v projections;
w = -e^{-1/2} sigmoid(w_lora(x_w)) (tanh LoRA) the log-decay; v lerped towards
the first layer's v by sigmoid(v_lora(x_v)) in every later layer;
a = sigmoid(a_lora(x_a)); g = g_lora(x_g) (sigmoid inside); kk = L2-normalised
k * k_k per head; k = k (1 + (a - 1) k_a);
    S = (diag(exp w) - (kk a) kk^T) S + k v^T;   o = S^T r
then GroupNorm per head (eps head_dim * norm_eps), + (r k r_k).sum * v, times g,
and o_proj.

rwkv6 (fla RWKV6ForCausalLM, fla/models/rwkv6, fla/layers/rwkv6.py) has rwkv7's
skeleton (LayerNorms, pre_norm, the two token shifts) with RWKV-6's mixes. The
time mix: xx = tanh(Linear(x + delta * mu)) in 5 groups of proj_low_rank_dim,
each through its slice of one Linear back to hidden_size, plus x_bias: the
data-dependent mixes m_r, m_w, m_k, m_v, m_g; then r, k, v, g = Linear(x +
delta * m_*), w = LoRA(x + delta * m_w) (tanh, with bias), the log-decay
-exp(w); per head of key_dim / num_heads keys and value_dim / num_heads values
    o = (S + u k v^T)^T r;   S = diag(exp(-exp(w))) S + k v^T
with u the layer's bonus; then GroupNorm per head (eps norm_eps) times
silu(g), and o_proj. The channel mix: sigmoid(receptance(x + delta * mu_r)) *
value(relu(key(x + delta * mu_k))^2).

Hybrids (fla's `attn` config, fla/models/hybrid.py: one spec or a list of
them, each {layers, num_heads, num_kv_heads, qkv_bias, window_size,
rope_theta}) put fla's softmax Attention (fla/layers/attn.py) in place of the
type's mixer in the layers a spec names, for the types built on Block
(linear_attn, retnet, gla, delta_net, gated_deltanet) and for rwkv6 (in
place of its time mix; the channel mix keeps its token shift): q, k, v projections
(with bias for qkv_bias) of num_heads query and num_kv_heads key/value heads
of hidden_size / num_heads, GPT-NeoX rotary over the whole head at the
token's position (base rope_theta), causal softmax with scale head_dim^-1/2
over the keys j with i - window_size < j <= i (flash_attn's window
(window_size - 1, 0); every earlier key without a window), each key head
shared by num_heads / num_kv_heads query heads, and o_proj without bias. A
sequence run in pieces sees what the whole sequence sees (fla's own cache
keeps only the last window_size keys, so its multi-token steps after the
first see fewer; the whole sequence is what the model was trained on).

granitemoehybrid (transformers' GraniteMoeHybridForCausalLM,
models/granitemoehybrid/modeling_granitemoehybrid.py, in transformers' own
names and config fields): x = embed_tokens[tokens] * embedding_multiplier;
per layer, of the kind layer_types (alias layers_block_type; all "mamba"
when absent) names,
    x = x + residual_multiplier * mixer(RMSNorm(x))
    x = x + residual_multiplier * (moe(RMSNorm(x)) + shared_mlp(RMSNorm(x)))
(without experts, num_local_experts 0, the shared MLP alone; with
shared_intermediate_size 0 no shared MLP); logits = lm_head(RMSNorm(x)) /
logits_scaling. The MoE: router logits = Linear(x), its top num_experts_per_tok,
softmax over those only; each chosen expert e gives output_linear[e](silu(a) *
b), [a | b] = input_linear[e] x (weights (E, out, in)); the shared MLP the same
with nn.Linears. The attention: q, k, v, o projections (bias on all four with
attention_bias), GQA (query head h reads key head h // (heads / kv_heads)),
rotary only when position_embedding_type is "rope" (GPT-NeoX halves over the
whole head, theta rope_theta, tables in float32; Granite 4.0 is "nope"),
causal softmax with scale attention_multiplier. The Mamba-2 layer, as its
cached decode step computes: in_proj [gate | x B C | dt]; x B C through the
depthwise causal conv1d (bias with mamba_conv_bias) and SiLU; head h reads
group h // (heads / n_groups); dt = clamp(softplus(dt + dt_bias),
time_step_limit), A = -exp(A_log):
    S = exp(dt A) S + dt x_h B^T;  y_h = S C + D_h x_h
then RMSNorm(y * silu(gate)) over all mamba_expand * hidden_size channels (one
group whatever n_groups) times its weight, and out_proj (in_proj and out_proj
with bias for mamba_proj_bias).

qwen3_next (transformers' Qwen3NextForCausalLM,
models/qwen3_next/modeling_qwen3_next.py, in transformers' own names and
config fields): x = embed_tokens[tokens]; per layer, of the kind layer_types
names (absent: every full_attention_interval-th layer, default 4, full
attention, the others linear; legacy "mamba"/"attention" remapped),
    x = x + mixer(RMSNorm(x));  x = x + mlp(RMSNorm(x))
logits = lm_head(RMSNorm(x)), every RMSNorm here zero-centred:
x rsqrt(mean x^2 + eps) (1 + w). mlp: the sparse MoE block in layer i when i
is not in mlp_only_layers, num_experts > 0 and (i + 1) % decoder_sparse_step
== 0, else a dense SwiGLU MLP of intermediate_size. The MoE: softmax over all
experts of the router's logits, its top num_experts_per_tok (renormalised to
sum 1 with norm_topk_prob), each chosen expert down(silu(gate) * up), plus the
shared expert (SwiGLU) times sigmoid(shared_expert_gate(x)). The attention:
q_proj gives per head [query | gate] (2 head_dim), q_norm and k_norm
(zero-centred, per head), rotary on the first int(head_dim *
partial_rotary_factor) channels of each head (GPT-NeoX halves, tables in
float32, theta and factor from rope_parameters, else the top-level fields,
else 10000 and 0.25), causal softmax with scale head_dim^-1/2 (GQA), the
output times sigmoid(gate), o_proj (all four projections with bias for
attention_bias). The linear layers (Gated DeltaNet): in_proj_qkvz and
in_proj_ba grouped per key head ([q | k | v | z] and [b | a] for each in
turn), q|k|v through a depthwise causal conv1d (no bias) and SiLU, beta =
sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), value head j reading key
head j // (Hv / Hk), q and k L2-normalised, q scaled by head_k_dim^-1/2:
    S = exp(g) S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
then w * RMSNorm(o) * silu(z) per value head (w not zero-centred), out_proj.

Usage:
    linattn_ref.py logits --model DIR --tokens 1,2,3 --out L.npy [--dtype float64] [--all]
    linattn_ref.py random --out DIR --feature-map elu [--normalized] [--num-kv-heads 2] ...
    linattn_ref.py random --out DIR --model-type gated_deltanet [--num-v-heads 8] ...
    linattn_ref.py random --out DIR --model-type delta_net [--qk-norm sum] ...
    linattn_ref.py random --out DIR --model-type gla [--num-kv-heads 2 --short-conv] ...
    linattn_ref.py random --out DIR --model-type retnet [--num-kv-heads 2] ...
    linattn_ref.py random --out DIR --model-type mamba2 [--n-groups 2] ...
    linattn_ref.py random --out DIR --model-type rwkv7 [--head-dim 16 --low-rank-dim 8] ...
    linattn_ref.py random --out DIR --model-type rwkv6 [--num-heads 4 --expand-k 0.5] ...
    linattn_ref.py random --out DIR --model-type gla --attn '{"layers": [1], "num_heads": 4}' ...
    linattn_ref.py random --out DIR --model-type granitemoehybrid --layer-types mamba,attention \
        [--num-experts 0 --nope --n-groups 2 --mamba-proj-bias ...]
    linattn_ref.py random --out DIR --model-type qwen3_next \
        --layer-types linear_attention,full_attention [--num-experts 0 --fused-experts ...]
    linattn_ref.py generate --model DIR --prompt TEXT --max-tokens N   (greedy, byte models)
    linattn_ref.py bench --model DIR --prompt-tokens N --decode-tokens N (JSON timings)
"""

import argparse
import json
import math
import os
import re
import struct
import sys
import time


def _openblas_coretype():
    """Debian's torch runs its GEMMs on OpenBLAS, which does not pick its
    AVX-512 kernels on every CPU family that has them unless told to; this
    must happen before OpenBLAS loads."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return
    if " avx512f" in flags and " avx512bw" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


_openblas_coretype()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

FEATURE_MAPS = ("elu", "relu", "identity", "t2r", "hedgehog", "dpfp", "elementwise_product")
# transformers' ACT2FN entries that RetNet's feature_map may name (None: no
# map); "gelu" there is the exact (erf) GELU.
RETNET_FEATURE_MAPS = {
    None: lambda x: x,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "silu": lambda x: torch.nn.functional.silu(x),
    "swish": lambda x: torch.nn.functional.silu(x),
    "gelu": lambda x: torch.nn.functional.gelu(x),
}
# fla/modules/activations.py's ACT2FN entries that GLA's feature_map may name
# (None: no map); fla's tanh-approximate gelu is not built here.
GLA_FEATURE_MAPS = {
    None: lambda x: x,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "logsigmoid": lambda x: torch.nn.functional.logsigmoid(x),
    "silu": lambda x: torch.nn.functional.silu(x),
    "swish": lambda x: torch.nn.functional.silu(x),
    "sqrelu": lambda x: torch.relu(x) ** 2,
}

# ---------------------------------------------------------------- safetensors


def read_safetensors(path):
    """name -> float32 numpy array (F32, F16 and BF16 entries)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin:base + end]
        shape = entry["shape"]
        dtype = entry["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            raise ValueError(f"{name}: unsupported dtype {dtype}")
        out[name] = arr.reshape(shape).astype(np.float32)
    return out


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, rounding to nearest even."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype("<u2")


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: name -> float32 array, written as F32, F16 or BF16."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        elif dtype == "BF16":
            raw = to_bf16_bits(a).tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


# ---------------------------------------------------------------- config


# The model types whose fla block takes an attention layer in this reference,
# and why the others do not.
HYBRID_TYPES = ("linear_attn", "retnet", "gla", "delta_net", "gated_deltanet", "rwkv6")
HYBRID_REFUSED = {
    "mamba2": "fla's Mamba2Config has no attn field (its blocks ignore one)",
    "rwkv7": "fla's RWKV7Block unpacks four values from Attention, which returns three: "
             "fla cannot run it",
    "granitemoehybrid": "transformers' GraniteMoeHybridConfig has no attn field (its "
                        "layer_types place the attention layers)",
    "qwen3_next": "transformers' Qwen3NextConfig has no attn field (its layer_types, or "
                  "full_attention_interval, place the attention layers)",
}


def hybrid_attention_layers(attn, num_hidden_layers, hidden_size):
    """fla's normalize_hybrid_attention_config (fla/models/hybrid.py): None,
    one spec or a list of specs; layers a list of distinct indices in [0,
    num_hidden_layers), each in one spec only; num_heads and num_kv_heads (=
    num_heads when absent or null) positive integers; qkv_bias a Boolean
    (False); window_size null or a positive integer; rope_theta positive and
    finite (10000). Attention also needs hidden_size / num_heads whole (its
    head reshape) and num_heads / num_kv_heads whole (flash_attn's groups).
    Returns {layer: spec}."""
    if attn is None:
        return {}
    if not isinstance(attn, (dict, list)):
        raise ValueError(f"attn must be None, a dictionary, or a list of dictionaries; got {attn!r}")
    single = isinstance(attn, dict)
    out = {}

    def positive(value, field, where):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where} field {field!r} must be a positive integer; got {value!r}")
        return value

    for index, spec in enumerate([attn] if single else attn):
        where = "attn specification" if single else f"attn specification at index {index}"
        if not isinstance(spec, dict):
            raise ValueError(f"{where} must be a dictionary; got {spec!r}")
        for field in ("layers", "num_heads"):
            if field not in spec:
                raise ValueError(f"{where} field {field!r} is required; got <missing>")
        layers = spec["layers"]
        if not isinstance(layers, (list, tuple)):
            raise ValueError(f"{where} field 'layers' must be a list or tuple of integer layer "
                             f"indices; got {layers!r}")
        norm = dict(spec)
        norm["num_heads"] = positive(spec["num_heads"], "num_heads", where)
        kv = spec.get("num_kv_heads")
        norm["num_kv_heads"] = positive(norm["num_heads"] if kv is None else kv, "num_kv_heads",
                                        where)
        norm["qkv_bias"] = spec.get("qkv_bias", False)
        if not isinstance(norm["qkv_bias"], bool):
            raise ValueError(f"{where} field 'qkv_bias' must be a Boolean; got {norm['qkv_bias']!r}")
        window = spec.get("window_size")
        norm["window_size"] = None if window is None else positive(window, "window_size", where)
        theta = spec.get("rope_theta", 10000.0)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or \
                not math.isfinite(theta) or theta <= 0:
            raise ValueError(f"{where} field 'rope_theta' must be positive and finite; got {theta!r}")
        norm["rope_theta"] = float(theta)
        if hidden_size % norm["num_heads"]:
            raise ValueError(f"{where}: hidden_size {hidden_size} is not a multiple of num_heads "
                             f"{norm['num_heads']}")
        if norm["num_heads"] % norm["num_kv_heads"]:
            raise ValueError(f"{where}: num_heads {norm['num_heads']} is not a multiple of "
                             f"num_kv_heads {norm['num_kv_heads']}")
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise ValueError(f"{where} field 'layers' must contain only integer layer "
                                 f"indices; got {layer!r}")
            if layer < 0 or layer >= num_hidden_layers:
                raise ValueError(f"{where} field 'layers' contains out-of-range layer {layer!r}; "
                                 f"expected a value in [0, {num_hidden_layers})")
            if layer in out:
                raise ValueError(f"{where} assigns layer {layer!r} twice or more")
            out[layer] = norm
    return out


def not_null(d, field, default):
    """d[field] (`default` when absent); a present null is refused."""
    value = d.get(field, default)
    if value is None:
        raise ValueError(f"{field}: null is not supported")
    return value


class Config:
    """The fields of fla's LinearAttentionConfig or GatedDeltaNetConfig (with
    their defaults) that change the math; refuses the parts this reference
    does not build."""

    def __init__(self, d):
        self.raw = d
        self.model_type = d.get("model_type", "linear_attn")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} not supported")
        kind = MODEL_TYPES[self.model_type]
        gdn = self.model_type == "gated_deltanet"
        self.hidden_size = d.get("hidden_size", 2048)
        self.num_hidden_layers = d.get("num_hidden_layers", 21 if gdn else 24)
        self.num_heads = d.get("num_heads", kind.num_heads)
        # RetNetConfig's default is 2, the others' 4; an explicit null is 4
        # for all (fla's GatedMLP turns hidden_ratio None into 4).
        self.hidden_ratio = d.get("hidden_ratio", 2 if self.model_type == "retnet" else 4) or 4
        self.intermediate_size = d.get("intermediate_size")
        if self.intermediate_size is None:
            i = int(self.hidden_size * self.hidden_ratio * 2 / 3)
            self.intermediate_size = 256 * ((i + 256 - 1) // 256)
        self.norm_eps = d.get("norm_eps", 1e-6)
        if self.model_type == "mamba2":
            # Mamba2Config: 1e-5; older fla wrote layer_norm_epsilon.
            self.norm_eps = d.get("norm_eps", d.get("layer_norm_epsilon", 1e-5))
        self.vocab_size = d.get("vocab_size", 32000)
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        # fla's GatedMLP (and the output gates, which take it as gate_fn) is
        # built for swish; mamba2's convolution takes silu or swish (the same).
        # rwkv7's and rwkv6's channel mixes are ReLU² (fla's ACT2FN "sqrelu").
        # granitemoehybrid's hidden_act (transformers' ACT2FN) drives its
        # experts, its shared MLP and its Mamba convolution.
        # qwen3_next's drives its MLPs and experts; its convolution and gated
        # norm follow it on transformers' fast path (causal_conv1d, fla) but
        # are SiLU whatever it says on the torch path: silu (or ACT2FN's alias
        # swish) is the only value on which the two agree.
        act = d.get("hidden_act", {"mamba2": "silu", "rwkv7": "sqrelu", "rwkv6": "sqrelu",
                                   "granitemoehybrid": "silu",
                                   "qwen3_next": "silu"}.get(self.model_type, "swish"))
        accepted = {"mamba2": ("swish", "silu"), "rwkv7": ("sqrelu",),
                    "rwkv6": ("sqrelu",),
                    "granitemoehybrid": ("silu", "swish"),
                    "qwen3_next": ("silu", "swish")}.get(self.model_type, ("swish",))
        if act not in accepted:
            raise ValueError(f"hidden_act {act!r} not supported")
        # Parts of fla's configs this reference does not build.
        if d.get("attnres_block_size") is not None:
            raise ValueError("attnres_block_size is not supported by this reference")
        self.attn_layers = hybrid_attention_layers(d.get("attn"), self.num_hidden_layers,
                                                   self.hidden_size)
        if self.attn_layers and self.model_type not in HYBRID_TYPES:
            raise ValueError(f"attn: {HYBRID_REFUSED.get(self.model_type, 'not supported')}")
        kind.read_config(self, d)

    def _linear_attn(self, d):
        self.num_kv_heads = d.get("num_kv_heads") or self.num_heads
        self.expand_k = d.get("expand_k", 1)
        self.expand_v = d.get("expand_v", 1)
        self.feature_map = d.get("feature_map", "elementwise_product")
        self.tie_feature_map_qk = bool(d.get("tie_feature_map_qk", False))
        self.norm_q = bool(d.get("norm_q", False))
        self.norm_k = bool(d.get("norm_k", False))
        self.norm_feature_map = bool(d.get("norm_feature_map", False))
        self.elementwise_affine = d.get("elementwise_affine", True)
        if self.elementwise_affine is None:
            self.elementwise_affine = True
        self.key_dim = int(self.hidden_size * self.expand_k)
        self.value_dim = int(self.hidden_size * self.expand_v)
        self.head_k_dim = self.key_dim // self.num_heads
        self.head_v_dim = self.value_dim // self.num_heads
        self.groups = self.num_heads // self.num_kv_heads
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map {self.feature_map!r} not supported")

    def _grouped_heads(self, d, expand_k, expand_v, feature_maps):
        # The split GatedLinearAttention and MultiScaleRetention share.
        self.num_kv_heads = d.get("num_kv_heads") or self.num_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.key_dim = int(self.hidden_size * d.get("expand_k", expand_k))
        self.value_dim = int(self.hidden_size * d.get("expand_v", expand_v))
        if self.key_dim % self.num_heads or self.value_dim % self.num_heads:
            raise ValueError("key and value dims must be multiples of num_heads")
        self.head_k_dim = self.key_dim // self.num_heads
        self.head_v_dim = self.value_dim // self.num_heads
        self.feature_map = d.get("feature_map")
        if self.feature_map not in feature_maps:
            raise ValueError(f"feature_map {self.feature_map!r} not supported")
        self.use_output_gate = bool(d.get("use_output_gate", True))
        # fla's norms test `if elementwise_affine:`: null means no weight.
        self.elementwise_affine = bool(d.get("elementwise_affine", True))
        self.fuse_norm = bool(d.get("fuse_norm", True))

    def _retnet(self, d):
        # RetNetConfig's defaults; RetNetBlock passes no use_short_conv.
        self._grouped_heads(d, 1.0, 2.0, RETNET_FEATURE_MAPS)
        if self.head_k_dim % 2 or self.head_k_dim > 256:
            raise ValueError("retnet takes an even head_k_dim of at most 256")
        self.use_short_conv = False

    def _gla(self, d):
        # GLAConfig's defaults and GatedLinearAttention.__init__'s split.
        self._grouped_heads(d, 0.5, 1.0, GLA_FEATURE_MAPS)
        self.use_short_conv = bool(d.get("use_short_conv", False))
        self.conv_size = d.get("conv_size", 4)
        self.clamp_min = d.get("clamp_min")

    def _delta_net(self, d):
        # DeltaNetConfig's defaults; DeltaNet.__init__ splits key_dim and
        # value_dim evenly over the heads.
        self.key_dim = int(self.hidden_size * d.get("expand_k", 1.0))
        self.value_dim = int(self.hidden_size * d.get("expand_v", 1.0))
        if self.key_dim % self.num_heads or self.value_dim % self.num_heads:
            raise ValueError("key and value dims must be multiples of num_heads")
        self.head_k_dim = self.key_dim // self.num_heads
        self.head_v_dim = self.value_dim // self.num_heads
        self.num_v_heads = self.num_heads
        self.use_gate = bool(d.get("use_gate", False))
        self.use_short_conv = bool(d.get("use_short_conv", True))
        self.conv_size = d.get("conv_size", 4)
        self.use_beta = bool(d.get("use_beta", True))
        self.allow_neg_eigval = bool(d.get("allow_neg_eigval", False))
        self.qk_activation = d.get("qk_activation", "silu")
        self.qk_norm = d.get("qk_norm", "l2")
        if self.qk_activation not in ("silu", "relu", "elu", "identity"):
            raise ValueError(f"qk_activation {self.qk_activation!r} not supported")
        if self.qk_norm not in ("l2", "sum"):
            raise ValueError(f"qk_norm {self.qk_norm!r} not supported")

    def _mamba2(self, d):
        # Mamba2Config's defaults, reading the older spellings too
        # (time_step_limit, rms_norm); num_heads must be expand * D / head_dim.
        self.num_hidden_layers = d.get("num_hidden_layers", 48)
        self.expand = d.get("expand", 2)
        self.head_dim = d.get("head_dim", 64)
        self.intermediate_size = int(self.expand * self.hidden_size)
        heads = int(self.expand * self.hidden_size / self.head_dim)
        if self.num_heads is not None and self.num_heads != heads:
            raise ValueError(f"num_heads {self.num_heads} != expand * hidden_size / head_dim")
        self.num_heads = heads
        if self.intermediate_size != heads * self.head_dim:
            raise ValueError("expand * hidden_size must be a multiple of head_dim")
        self.state_size = d.get("state_size", 128)
        self.n_groups = d.get("n_groups", 1)
        if self.num_heads % self.n_groups:
            raise ValueError("num_heads must be a multiple of n_groups")
        self.conv_kernel = d.get("conv_kernel", 4)
        self.use_conv_bias = bool(d.get("use_conv_bias", True))
        self.use_bias = bool(d.get("use_bias", False))
        # fla applied the gated norm whatever an older config's rms_norm said
        # (September 2024 to April 2026, but its first release honoured it):
        # rms_norm false without rmsnorm is ambiguous and refused.
        if "rmsnorm" not in d and d.get("rms_norm", True) is False:
            raise ValueError("rms_norm false: fla releases disagree on its meaning; "
                             "set rmsnorm explicitly")
        self.rmsnorm = bool(d.get("rmsnorm", True))
        self.norm_before_gate = bool(d.get("norm_before_gate", False))
        self.D_has_hdim = bool(d.get("D_has_hdim", False))
        limit = d.get("dt_limit", d.get("time_step_limit", (0.0, float("inf"))))
        self.dt_limit = (float(limit[0]), float(limit[1]))
        self.conv_dim = self.intermediate_size + 2 * self.n_groups * self.state_size

    def _gated_deltanet(self, d):
        # GatedDeltaNet.__init__: head_v_dim = int(head_dim * expand_v), and
        # num_v_heads (default num_heads) a multiple of num_heads.
        self.head_k_dim = d.get("head_dim", 256)
        self.expand_v = d.get("expand_v", 2.0)
        self.num_v_heads = d.get("num_v_heads") or self.num_heads
        self.head_v_dim = int(self.head_k_dim * self.expand_v)
        if not math.isclose(self.head_k_dim * self.expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError("head_dim * expand_v must be an integer")
        if self.num_v_heads % self.num_heads != 0:
            raise ValueError("num_v_heads must be a multiple of num_heads")
        self.key_dim = self.num_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.use_gate = bool(d.get("use_gate", True))
        self.use_short_conv = bool(d.get("use_short_conv", True))
        self.conv_size = d.get("conv_size", 4)
        self.allow_neg_eigval = bool(d.get("allow_neg_eigval", False))


    def _rwkv7(self, d):
        # RWKV7Config's defaults (fla/models/rwkv7/configuration_rwkv7.py) and
        # what RWKV7Attention and RWKV7FeedForward make of them.
        h = self.hidden_size
        self.norm_eps = d.get("norm_eps", 1e-5)
        # RWKV7Config: head_dim from num_heads when head_dim is null; then
        # RWKV7Attention takes head_dim over num_heads.
        head_dim, num_heads = d.get("head_dim", 64), d.get("num_heads")
        if head_dim is None:
            if num_heads is None:
                raise ValueError("head_dim or num_heads must be given")
            head_dim = h // num_heads
        if head_dim <= 0 or h % head_dim:
            raise ValueError("hidden_size must be a multiple of head_dim")
        self.head_dim = self.head_k_dim = head_dim
        self.num_heads = h // head_dim
        # value_dim: one per layer (RWKV7Config's list), each a multiple of
        # hidden_size; v_first is layer 0's v mixed into every later layer's,
        # so they must all be the same.
        value_dim = d.get("value_dim")
        if value_dim is None:
            value_dim = h
        elif isinstance(value_dim, list):
            if len(value_dim) != self.num_hidden_layers or len(set(value_dim)) != 1:
                raise ValueError("value_dim: one value for every layer")
            value_dim = value_dim[0]
        if value_dim < h or value_dim % h:
            raise ValueError("value_dim must be a multiple of hidden_size")
        self.value_dim = value_dim
        self.head_v_dim = value_dim // self.num_heads
        # RWKV7Attention's defaults when the config's are null ("factor" for
        # head_dim > 64; Python's round() rounds halves to even).
        factor = head_dim / 64
        sq = h ** 0.5
        for field, default, scale, per_head in (("decay_low_rank_dim", 64, 2.5, True),
                                                ("gate_low_rank_dim", 128, 5, False),
                                                ("a_low_rank_dim", 64, 2.5, True),
                                                ("v_low_rank_dim", 16, 1.7, True)):
            rank = d.get(field, default)
            if rank is None:
                rank = max(32, int(round(scale * sq * (factor if per_head else 1) / 32) * 32))
            setattr(self, field, rank)
        # RWKV7FeedForward: int(hidden · ratio) rounded up to a multiple of 32.
        self.intermediate_size = d.get("intermediate_size")
        if self.intermediate_size is None:
            i = int(h * (d.get("hidden_ratio", 4) or 4))
            self.intermediate_size = 32 * ((i + 32 - 1) // 32)
        self.norm_first = bool(d.get("norm_first", True))
        self.norm_bias = bool(d.get("norm_bias", True))
        self.fuse_norm = bool(d.get("fuse_norm", True))

    def _rwkv6(self, d):
        # RWKV6Config's defaults (fla/models/rwkv6/configuration_rwkv6.py) and
        # what RWKV6Attention and RWKV6FeedForward make of them.
        h = self.hidden_size
        self.norm_eps = d.get("norm_eps", 1e-5)
        self.key_dim = int(h * d.get("expand_k", 0.5))
        self.value_dim = int(h * d.get("expand_v", 1.0))
        if self.key_dim % self.num_heads or self.value_dim % self.num_heads:
            raise ValueError("key and value dims must be multiples of num_heads")
        self.head_k_dim = self.key_dim // self.num_heads
        self.head_v_dim = self.value_dim // self.num_heads
        # x_proj needs its rank; a null gate_low_rank_dim makes w_proj a plain
        # Linear (DDLerpLinear without low_rank_dim).
        self.proj_low_rank_dim = d.get("proj_low_rank_dim", 32)
        if self.proj_low_rank_dim is None:
            raise ValueError("proj_low_rank_dim must be a positive integer")
        self.gate_low_rank_dim = d.get("gate_low_rank_dim", 64)
        # RWKV6FeedForward: hidden_ratio None is 3.5; int(h * ratio) rounded up to
        # a multiple of 32 unless intermediate_size is given.
        ratio = d.get("hidden_ratio", 3.5)
        if ratio is None:
            ratio = 3.5
        self.intermediate_size = d.get("intermediate_size")
        if self.intermediate_size is None:
            i = int(h * ratio)
            self.intermediate_size = 32 * ((i + 32 - 1) // 32)
        self.norm_first = bool(d.get("norm_first", True))
        self.norm_bias = bool(d.get("norm_bias", True))
        # fla's g_norm takes norm_eps; tools/convert_rwkv.py writes BlinkDL's
        # own 64e-5 as linattn_group_norm_eps (which fla ignores).
        self.group_norm_eps = d.get("linattn_group_norm_eps", self.norm_eps)

    def _granitemoehybrid(self, d):
        # transformers' GraniteMoeHybridConfig (configuration_granitemoehybrid.py):
        # its own field names and defaults, not fla's. A null where the
        # config's default is a number would crash transformers' model: refused.
        def get(field, default):
            return not_null(d, field, default)

        h = self.hidden_size = get("hidden_size", 4096)
        self.num_hidden_layers = get("num_hidden_layers", 32)
        self.vocab_size = get("vocab_size", 32000)
        self.norm_eps = get("rms_norm_eps", 1e-6)
        # Attention: num_key_value_heads null is num_attention_heads; head_dim
        # is no field of the config, but the attention and the rotary read
        # one if config.json has it (else hidden_size // num_attention_heads).
        self.num_heads = get("num_attention_heads", 32)
        kv = d.get("num_key_value_heads")
        self.num_kv_heads = self.num_heads if kv is None else kv
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.head_dim = d.get("head_dim") or h // self.num_heads
        self.attention_bias = bool(get("attention_bias", False))
        self.embedding_multiplier = float(get("embedding_multiplier", 1.0))
        self.logits_scaling = float(get("logits_scaling", 1.0))
        self.residual_multiplier = float(get("residual_multiplier", 1.0))
        self.attention_multiplier = float(get("attention_multiplier", 1.0))
        # Rotary only for position_embedding_type exactly "rope" (None, the
        # default, and Granite 4.0's "nope": no positions at all). Its theta:
        # rope_scaling or rope_parameters' rope_theta, else the top-level
        # rope_theta (10000), as standardize_rope_params reads them; the
        # default rope type only (its inverse frequencies over the whole head:
        # no partial rotary).
        self.position_embedding_type = d.get("position_embedding_type")
        self.rope = self.position_embedding_type == "rope"
        params = d.get("rope_scaling") or d.get("rope_parameters") or {}
        self.rope_theta = params.get("rope_theta") or d.get("rope_theta", 10000.0)
        rope_type = params.get("rope_type", params.get("type", "default"))
        if self.rope and rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} not supported")
        if self.rope and self.rope_theta is None:
            raise ValueError("rope_theta: null is not supported")
        # Feed-forward: MoE when num_local_experts > 0 (experts of
        # intermediate_size), plus the shared MLP of shared_intermediate_size
        # (0: none); dense models (num_local_experts 0) have the shared MLP only.
        self.intermediate_size = get("intermediate_size", 11008)
        self.num_local_experts = get("num_local_experts", 8)
        self.num_experts_per_tok = get("num_experts_per_tok", 2)
        self.shared_intermediate_size = get("shared_intermediate_size", 1024)
        if self.num_local_experts > 0 and not 0 < self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError("num_experts_per_tok must be in [1, num_local_experts]")
        # layer_types, or its alias layers_block_type (attribute_map; set
        # after layer_types, so it wins); absent or null: every layer Mamba.
        types = d.get("layers_block_type")
        if types is None:
            types = d.get("layer_types")
        if types is None:
            types = ["mamba"] * self.num_hidden_layers
        if len(types) != self.num_hidden_layers or any(t not in ("mamba", "attention")
                                                       for t in types):
            raise ValueError("layer_types: one of 'mamba', 'attention' for every layer")
        self.layer_types = list(types)
        # Mamba-2: intermediate = int(mamba_expand * hidden_size) in
        # mamba_n_heads heads of mamba_d_head ("auto": the quotient).
        self.mamba_n_heads = get("mamba_n_heads", 128)
        self.mamba_n_groups = get("mamba_n_groups", 1)
        self.mamba_d_state = get("mamba_d_state", 256)
        self.mamba_d_conv = get("mamba_d_conv", 4)
        self.mamba_expand = get("mamba_expand", 2)
        self.mamba_intermediate = int(self.mamba_expand * h)
        if self.mamba_intermediate % self.mamba_n_heads:
            raise ValueError("mamba_n_heads must divide mamba_expand * hidden_size")
        d_head = get("mamba_d_head", "auto")
        self.mamba_d_head = self.mamba_intermediate // self.mamba_n_heads if d_head == "auto" \
            else d_head
        if self.mamba_d_head * self.mamba_n_heads != self.mamba_intermediate:
            raise ValueError("mamba_d_head * mamba_n_heads != mamba_expand * hidden_size")
        if self.mamba_n_heads % self.mamba_n_groups:
            raise ValueError("mamba_n_heads must be a multiple of mamba_n_groups")
        self.mamba_conv_bias = bool(get("mamba_conv_bias", True))
        self.mamba_proj_bias = bool(get("mamba_proj_bias", False))
        limit = get("time_step_limit", (0.0, float("inf")))
        self.time_step_limit = (float(limit[0]), float(limit[1]))
        self.mamba_conv_dim = self.mamba_intermediate + 2 * self.mamba_n_groups * self.mamba_d_state

    def _qwen3_next(self, d):
        # transformers' Qwen3NextConfig (configuration_qwen3_next.py): its own
        # field names and defaults. Its fields are typed (huggingface_hub's
        # @strict): a null where the type is a number is refused here.
        def get(field, default):
            return not_null(d, field, default)

        def integer(field, default, minimum=1):
            value = get(field, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{field} must be an integer >= {minimum}; got {value!r}")
            return value

        def number(field, value):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                raise ValueError(f"{field} must be a finite number; got {value!r}")
            return float(value)

        def boolean(field, default):
            value = get(field, default)
            if not isinstance(value, bool):
                raise ValueError(f"{field} must be true or false; got {value!r}")
            return value

        self.hidden_size = integer("hidden_size", 2048)
        L = self.num_hidden_layers = integer("num_hidden_layers", 48)
        self.vocab_size = integer("vocab_size", 151936)
        self.norm_eps = number("rms_norm_eps", get("rms_norm_eps", 1e-6))
        if self.norm_eps < 0:
            raise ValueError("rms_norm_eps must not be negative")
        # Every RMSNorm takes rms_norm_eps; the rule's L2 norm of q and k has
        # its own 1e-6 (l2norm's default).
        # Attention: num_attention_heads query heads of head_dim (a field of its
        # own, default 256, not hidden_size / heads), num_key_value_heads
        # key/value heads (repeat_kv: a divisor of the query heads).
        self.num_heads = integer("num_attention_heads", 16)
        self.num_kv_heads = integer("num_key_value_heads", 2)
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.head_dim = integer("head_dim", 256)
        self.attention_bias = boolean("attention_bias", False)
        # Gated DeltaNet layers: linear_num_key_heads q/k heads of
        # linear_key_head_dim, linear_num_value_heads v heads of
        # linear_value_head_dim, a whole number of value heads per key head
        # (fix_query_key_value_ordering's view); the depthwise convolution's
        # linear_conv_kernel_dim taps.
        self.linear_num_key_heads = integer("linear_num_key_heads", 16)
        self.linear_num_value_heads = integer("linear_num_value_heads", 32)
        self.linear_key_head_dim = integer("linear_key_head_dim", 128)
        self.linear_value_head_dim = integer("linear_value_head_dim", 128)
        self.linear_conv_kernel_dim = integer("linear_conv_kernel_dim", 4)
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        self.linear_key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        self.linear_value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        self.linear_conv_dim = 2 * self.linear_key_dim + self.linear_value_dim
        # layer_types (its legacy names remapped, remap_legacy_layer_types:
        # "mamba" -> linear_attention, "attention" -> full_attention); absent
        # or null: every full_attention_interval-th layer full attention.
        types = d.get("layer_types")
        if types is None:
            interval = integer("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(L)]
        if not isinstance(types, list):
            raise ValueError("layer_types must be a list")
        legacy = {"mamba": "linear_attention", "attention": "full_attention"}
        types = [legacy.get(t, t) if isinstance(t, str) else t for t in types]
        if len(types) != L or any(t not in ("linear_attention", "full_attention")
                                  for t in types):
            raise ValueError("layer_types: one of 'linear_attention', 'full_attention' for "
                             "every layer")
        self.layer_types = types
        # Feed-forward: a sparse MoE block in layer i when i is not in
        # mlp_only_layers, num_experts > 0 and (i + 1) % decoder_sparse_step
        # == 0; a dense MLP of intermediate_size otherwise.
        self.num_experts = integer("num_experts", 512, 0)
        only = d.get("mlp_only_layers")
        only = [] if only is None else only
        if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                             for i in only):
            raise ValueError("mlp_only_layers must be a list of layer indices")
        self.mlp_only_layers = list(only)
        if self.num_experts > 0:
            self.decoder_sparse_step = integer("decoder_sparse_step", 1)
            self.moe_layers = [i not in only and (i + 1) % self.decoder_sparse_step == 0
                               for i in range(L)]
        else:
            self.decoder_sparse_step = d.get("decoder_sparse_step", 1)
            self.moe_layers = [False] * L
        # The sizes: at least 1 where a layer uses them.
        moe, dense = (1 if any(self.moe_layers) else 0), (0 if all(self.moe_layers) else 1)
        self.intermediate_size = integer("intermediate_size", 5632, dense)
        self.num_experts_per_tok = integer("num_experts_per_tok", 10, moe)
        self.moe_intermediate_size = integer("moe_intermediate_size", 512, moe)
        self.shared_expert_intermediate_size = integer("shared_expert_intermediate_size", 512,
                                                       moe)
        self.norm_topk_prob = boolean("norm_topk_prob", True)
        if moe and self.num_experts_per_tok > self.num_experts:
            raise ValueError("num_experts_per_tok must be in [1, num_experts]")
        # Rotary, as PreTrainedConfig.convert_rope_params_to_dict and
        # standardize_rope_params (modeling_rope_utils.py) build
        # config.rope_parameters: the legacy rope_scaling when given (not
        # empty), else rope_parameters; its own rope_theta and
        # partial_rotary_factor win over the top-level fields, which win over
        # the defaults (10000, Qwen3NextConfig's 0.25). The default rope type
        # only, one dictionary for all layers.
        params = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if not isinstance(params, dict):
            raise ValueError("rope_parameters must be a dictionary")
        if params and set(params) <= set(self.layer_types):
            raise ValueError("rope_parameters per layer type are not supported")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} not supported")
        theta = params["rope_theta"] if "rope_theta" in params else d.get("rope_theta", 10000.0)
        # A null partial_rotary_factor is 1.0 in one transformers release and
        # a crash in another: refused.
        factor = (params["partial_rotary_factor"] if "partial_rotary_factor" in params
                  else d.get("partial_rotary_factor", 0.25))
        self.rope_theta = number("rope_theta", theta)
        if self.rope_theta <= 0:
            raise ValueError("rope_theta must be positive")
        self.partial_rotary_factor = number("partial_rotary_factor", factor)
        # compute_default_rope_parameters: dim = int(head_dim * factor), the
        # first dim channels of each head rotated (GPT-NeoX halves), the rest
        # passed through.
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(f"partial_rotary_factor {factor!r}: the rotary dimension "
                             f"int(head_dim * factor) = {self.rotary_dim} must be even and "
                             f"in [0, head_dim]")


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return Config(json.load(f))


# ---------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


# Feature maps, each transcribed from fla's own file, fla/modules/feature_map.py
# (flash-linear-attention at bc3b101d, August 2026), and from the inline maps of
# fla/layers/linear_attn.py: never from linattn's C++, so that a misreading there
# shows up as a difference here. tests/python/reference_feature_maps_test.py
# checks them against values worked out by hand from those files.


class Hedgehog(nn.Module):
    """HedgehogFeatureMap: an identity-initialised Linear(d, d) with bias, then
    softmax over the concatenation [2y, -2y]."""

    def __init__(self, d):
        super().__init__()
        self.layer = nn.Linear(d, d)
        nn.init.eye_(self.layer.weight)
        nn.init.zeros_(self.layer.bias)

    def forward(self, x):
        y = 2 * self.layer(x)
        return torch.cat([y, -y], dim=-1).softmax(-1)


class T2R(nn.Module):
    """T2RFeatureMap with fla's defaults (dot_dim = d, bias=False): relu(Wx)."""

    def __init__(self, d):
        super().__init__()
        self.layer = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.layer(x).relu()


class Hadamard(nn.Module):
    """HadamardFeatureMap: two Linear(d, d) with bias, multiplied elementwise."""

    def __init__(self, d):
        super().__init__()
        self.layer1 = nn.Linear(d, d)
        self.layer2 = nn.Linear(d, d)

    def forward(self, x):
        return self.layer1(x) * self.layer2(x)


def dpfp(x, nu=4):
    """DPFPFeatureMap.forward (nu = 4 as LinearAttention builds it). fla
    concatenates relu(x) with its negation -relu(x) (the DPFP paper has
    relu(-x) there; fla's checkpoints are trained with fla's), then multiplies
    nu copies of that by its rolls by 1..nu places."""
    r = x.relu()
    x = torch.cat([r, -r], dim=-1)
    x_rolled = torch.cat([x.roll(shifts=j, dims=-1) for j in range(1, nu + 1)], dim=-1)
    x_repeat = torch.cat([x] * nu, dim=-1)
    return x_repeat * x_rolled


def elu1(x):
    """linear_attn.py's inline `elu`: F.elu(x) + 1."""
    return F.elu(x) + 1


class LinearAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c.head_k_dim
        self.q_proj = nn.Linear(c.hidden_size, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_v_dim, bias=False)
        self.o_proj = nn.Linear(c.value_dim, c.hidden_size, bias=False)
        self.norm = RMSNorm(c.head_v_dim, c.norm_eps, c.elementwise_affine)
        learned = {"hedgehog": Hedgehog, "t2r": T2R, "elementwise_product": Hadamard}
        fm = c.feature_map
        if fm in learned:
            self.feature_map_q = learned[fm](d)
            self.feature_map_k = self.feature_map_q if c.tie_feature_map_qk else learned[fm](d)
        else:
            fn = {"elu": elu1, "relu": torch.relu, "identity": lambda x: x, "dpfp": dpfp}[fm]
            self.fq = self.fk = fn

    def phi(self, q, k):
        c = self.c
        if c.feature_map in ("hedgehog", "t2r", "elementwise_product"):
            q, k = self.feature_map_q(q), self.feature_map_k(k)
        else:
            q, k = self.fq(q), self.fk(k)
        if c.norm_q:
            q = q / (q.sum(-1, True) + 1e-4)
        if c.norm_k:
            k = k / (k.sum(-1, True) + 1e-4)
        return q, k

    def qkv(self, x):
        """x (..., hidden) -> phi(q), phi(k) (..., H, d_phi), v (..., H, d_v)."""
        c = self.c
        q = self.q_proj(x).unflatten(-1, (c.num_heads, c.head_k_dim))
        k = self.k_proj(x).unflatten(-1, (c.num_kv_heads, c.head_k_dim))
        v = self.v_proj(x).unflatten(-1, (c.num_kv_heads, c.head_v_dim))
        # fla repeats each key/value head over its group: query head j reads
        # key/value head j // groups.
        k = k.repeat_interleave(c.groups, dim=-2)
        v = v.repeat_interleave(c.groups, dim=-2)
        q, k = self.phi(q, k)
        return q, k, v

    def finish(self, o):
        return self.o_proj(self.norm(o).flatten(-2))

    def forward(self, x):
        """Whole sequences, x (B, T, hidden): the parallel (quadratic) form."""
        q, k, v = self.qkv(x)
        scale = q.shape[-1] ** -0.5
        q = q * scale
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        a = torch.einsum("bihd,bjhd->bhij", q, k).masked_fill(~mask, 0)
        o = torch.einsum("bhij,bjhd->bihd", a, v)
        if self.c.norm_feature_map:
            o = o / (a.sum(-1).transpose(1, 2).unsqueeze(-1) + 1e-10)
        return self.finish(o)

    def step(self, x, state):
        """One token per row, x (B, hidden); state (S (B,H,dphi,dv), z (B,H,dphi))."""
        q, k, v = self.qkv(x)
        q = q * q.shape[-1] ** -0.5
        s, z = state
        s = s + k.unsqueeze(-1) * v.unsqueeze(-2)
        z = z + k
        o = torch.einsum("bhd,bhde->bhe", q, s)
        if self.c.norm_feature_map:
            o = o / ((q * z).sum(-1, keepdim=True) + 1e-10)
        return self.finish(o), (s, z)

    def new_state(self, batch, dtype):
        c = self.c
        dphi = self.qkv(torch.zeros(1, c.hidden_size, dtype=dtype))[0].shape[-1]
        return (torch.zeros(batch, c.num_heads, dphi, c.head_v_dim, dtype=dtype),
                torch.zeros(batch, c.num_heads, dphi, dtype=dtype))


class ShortConvolution(nn.Module):
    """fla/modules/conv/short_conv.py as the layers build it: a depthwise
    causal Conv1d(C, C, W, groups=C, padding=W-1, bias=False), weight
    (C, 1, W), then SiLU (or nothing). y_t = silu(sum_j w[:, 0, j] x_{t-(W-1)+j}), inputs
    before the sequence 0 (or the cache: the W-1 inputs before it)."""

    def __init__(self, channels, width, silu=True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, width))
        self.silu = silu

    def forward(self, x, cache):
        """x (B, T, C), cache (B, W-1, C) -> y (B, T, C), new cache."""
        width = self.weight.shape[-1]
        xx = torch.cat([cache, x], dim=1)
        w = self.weight[:, 0, :]  # (C, W)
        y = torch.stack([(xx[:, t:t + width] * w.t()).sum(1) for t in range(x.shape[1])], dim=1)
        return (F.silu(y) if self.silu else y), xx[:, xx.shape[1] - (width - 1):]


def gated_delta_recurrence(q, k, v, g, beta, s):
    """fused_recurrent_gated_delta_rule's loop over tokens (state K-first):
    q, k (B, T, H, K) prepared, v (B, T, H, V), g and beta (B, T, H), s
    (B, H, K, V) -> o (B, T, H, V), s."""
    outs = []
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t]))
        s = s + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(outs, dim=1), s


class RecurrentMixer(nn.Module):
    """A token mixer defined by run(x, state) -> (out, state) over T tokens
    from a state of new_state(batch, dtype): whole sequences start from an
    empty state, a decode step is one token."""

    def forward(self, x):
        return self.run(x, self.new_state(x.shape[0], x.dtype))[0]

    def step(self, x, state):
        out, state = self.run(x[:, None], state)
        return out[:, 0], state

    def with_conv_states(self, s, batch, dtype, channels):
        """(s,) and, with short convolutions, the last W-1 inputs of each."""
        if not self.c.use_short_conv:
            return (s,)
        w = self.c.conv_size - 1
        return (s, *(torch.zeros(batch, w, ch, dtype=dtype) for ch in channels))

    def project_qkv(self, x, state):
        """q, k, v projections of x (flat), through the short convolutions
        (with their activations) when the layer has them; and the caches."""
        if not self.c.use_short_conv:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x), ()
        q, cq = self.q_conv1d(self.q_proj(x), state[1])
        k, ck = self.k_conv1d(self.k_proj(x), state[2])
        v, cv = self.v_conv1d(self.v_proj(x), state[3])
        return q, k, v, (cq, ck, cv)


def gated_recurrence(q, k, v, gk, s):
    """naive_recurrent_gla's loop (fla/ops/gla/naive.py), state K-first: q, k,
    gk (B, T, H, K) with q scaled, v (B, T, H, V), s (B, H, K, V) -> o, s."""
    outs = []
    for t in range(q.shape[1]):
        s = s * gk[:, t].exp()[..., None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(outs, dim=1), s


class GroupedGatedMixer(RecurrentMixer):
    """What fla's GatedLinearAttention and MultiScaleRetention share: q, k, v
    projections with k and v per key/value head (query head j reads head
    j // (num_heads/num_kv_heads), einops' '(h d) -> (h g) d'), an output
    RMSNorm per head (one weight for all heads; fla names it
    g_norm_swish_gate when fused with the swish output gate, g_norm
    otherwise: the math is the same) times silu(g_proj(x)) with
    use_output_gate, and o_proj."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        D, G = c.hidden_size, c.groups
        self.q_proj = nn.Linear(D, c.key_dim, bias=False)
        self.k_proj = nn.Linear(D, c.key_dim // G, bias=False)
        self.v_proj = nn.Linear(D, c.value_dim // G, bias=False)
        if c.use_output_gate:
            self.g_proj = nn.Linear(D, c.value_dim, bias=False)
        self.o_proj = nn.Linear(c.value_dim, D, bias=False)
        norm = RMSNorm(c.head_v_dim, c.norm_eps, c.elementwise_affine)
        self.fused_name = c.fuse_norm and c.use_output_gate
        if self.fused_name:
            self.g_norm_swish_gate = norm
        else:
            self.g_norm = norm

    def per_kv_head(self, x, d):
        """(..., kv_heads·d) -> (..., num_heads, d), each kv head repeated."""
        c = self.c
        return x.unflatten(-1, (c.num_kv_heads, d)).repeat_interleave(c.groups, dim=-2)

    def finish(self, o, x):
        c = self.c
        o = (self.g_norm_swish_gate if self.fused_name else self.g_norm)(o)
        if c.use_output_gate:
            o = o * F.silu(self.g_proj(x).unflatten(-1, (c.num_heads, c.head_v_dim)))
        return self.o_proj(o.flatten(-2))


class GatedLinearAttention(GroupedGatedMixer):
    """fla/layers/gla.py (GatedLinearAttention.forward), token by token (the
    file docstring has the formulas)."""

    def __init__(self, c):
        super().__init__(c)
        D, G = c.hidden_size, c.groups
        if c.use_short_conv:
            self.q_conv1d = ShortConvolution(c.key_dim, c.conv_size)
            self.k_conv1d = ShortConvolution(c.key_dim // G, c.conv_size)
            self.v_conv1d = ShortConvolution(c.value_dim // G, c.conv_size)
        # gate_low_rank_dim = 16, fixed in the layer; the second has a bias.
        self.gk_proj = nn.Sequential(nn.Linear(D, 16, bias=False),
                                     nn.Linear(16, c.key_dim // G, bias=True))

    def new_state(self, batch, dtype):
        c = self.c
        s = torch.zeros(batch, c.num_heads, c.head_k_dim, c.head_v_dim, dtype=dtype)
        return self.with_conv_states(s, batch, dtype, (c.key_dim, c.key_dim // c.groups,
                                                       c.value_dim // c.groups))

    def run(self, x, state):
        c = self.c
        q, k, v, caches = self.project_qkv(x, state)
        q = q.unflatten(-1, (c.num_heads, c.head_k_dim))
        k = self.per_kv_head(k, c.head_k_dim)
        v = self.per_kv_head(v, c.head_v_dim)
        gk = F.logsigmoid(self.per_kv_head(self.gk_proj(x), c.head_k_dim)) / 16
        if c.clamp_min is not None:
            gk = torch.clamp_min(gk, c.clamp_min)
        fm = GLA_FEATURE_MAPS[c.feature_map]
        q, k = fm(q), fm(k)
        o, s = gated_recurrence(q * c.head_k_dim ** -0.5, k, v, gk, state[0])
        return self.finish(o, x), (s, *caches)


def retention_log_decays(num_heads):
    """fla/ops/retention: log(1 - 2^(-5-h)) per head, computed in float32
    whatever the model's dtype (heads from 20 on round to no decay)."""
    h = torch.arange(num_heads, dtype=torch.float32)
    return (1 - torch.tensor(2.0, dtype=torch.float32).pow(-5.0 - h)).log()


def rotary(x, position, base=10000.0):
    """fla/modules/rotary.py's RotaryEmbedding(dim = head dim) on x
    (B, T, H, d), tokens at positions position, position + 1, ...: inv_freq,
    positions and their products in float32 (cos and sin tables then in x's
    dtype), GPT-NeoX halves (not interleaved):
    [x1 cos - x2 sin, x2 cos + x1 sin]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    t = torch.arange(position, position + x.shape[1], dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    cos = freqs.cos().to(x.dtype)[None, :, None, :]
    sin = freqs.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MultiScaleRetention(GroupedGatedMixer):
    """fla/layers/multiscale_retention.py (MultiScaleRetention.forward as
    RetNetBlock builds it: no short convolutions), token by token: an
    optional feature map on q and k, rotary at the tokens' absolute
    positions, then per head S = gamma_h S + k v^T, o = (q d_k^-1/2) S with
    gamma_h from retention_log_decays. The state carries the position."""

    def new_state(self, batch, dtype):
        c = self.c
        return (torch.zeros(batch, c.num_heads, c.head_k_dim, c.head_v_dim, dtype=dtype), 0)

    def run(self, x, state):
        c = self.c
        s, position = state
        q = self.q_proj(x).unflatten(-1, (c.num_heads, c.head_k_dim))
        k = self.k_proj(x).unflatten(-1, (c.num_kv_heads, c.head_k_dim))
        fm = RETNET_FEATURE_MAPS[c.feature_map]
        q, k = rotary(fm(q), position), rotary(fm(k), position)
        k = k.repeat_interleave(c.groups, dim=-2)
        v = self.per_kv_head(self.v_proj(x), c.head_v_dim)
        g = retention_log_decays(c.num_heads).to(x.dtype)
        gk = g[None, None, :, None].expand(x.shape[0], x.shape[1], c.num_heads, c.head_k_dim)
        o, s = gated_recurrence(q * c.head_k_dim ** -0.5, k, v, gk, s)
        return self.finish(o, x), (s, position + x.shape[1])


class DeltaRuleMixer(RecurrentMixer):
    """What fla's DeltaNet and GatedDeltaNet layers share: q/k/v projections
    through short convolutions (v always with SiLU, q and k with SiLU when
    `qk_silu`; without convolutions the same activations directly), an
    output RMSNorm per head (one weight for all heads) times silu(g_proj(x))
    with use_gate, and o_proj. State: (S (B, HV, K, V), and with
    convolutions the last W-1 inputs of each)."""

    def __init__(self, c, qk_silu):
        super().__init__()
        self.c = c
        self.qk_silu = qk_silu
        D = c.hidden_size
        self.q_proj = nn.Linear(D, c.key_dim, bias=False)
        self.k_proj = nn.Linear(D, c.key_dim, bias=False)
        self.v_proj = nn.Linear(D, c.value_dim, bias=False)
        if c.use_short_conv:
            self.q_conv1d = ShortConvolution(c.key_dim, c.conv_size, qk_silu)
            self.k_conv1d = ShortConvolution(c.key_dim, c.conv_size, qk_silu)
            self.v_conv1d = ShortConvolution(c.value_dim, c.conv_size)
        if c.use_gate:
            self.g_proj = nn.Linear(D, c.value_dim, bias=False)
        self.o_norm = RMSNorm(c.head_v_dim, c.norm_eps)
        self.o_proj = nn.Linear(c.value_dim, D, bias=False)

    def new_state(self, batch, dtype):
        c = self.c
        s = torch.zeros(batch, c.num_v_heads, c.head_k_dim, c.head_v_dim, dtype=dtype)
        return self.with_conv_states(s, batch, dtype, (c.key_dim, c.key_dim, c.value_dim))

    def qkv(self, x, state):
        """-> q, k (B, T, H, K), v (B, T, HV, V), the convolutions' caches."""
        c = self.c
        q, k, v, caches = self.project_qkv(x, state)
        if not c.use_short_conv:
            if self.qk_silu:
                q, k = F.silu(q), F.silu(k)
            v = F.silu(v)
        return (q.unflatten(-1, (c.num_heads, c.head_k_dim)),
                k.unflatten(-1, (c.num_heads, c.head_k_dim)),
                v.unflatten(-1, (c.num_v_heads, c.head_v_dim)), caches)

    def finish(self, o, x):
        c = self.c
        o = self.o_norm(o)
        if c.use_gate:
            o = o * F.silu(self.g_proj(x).unflatten(-1, (c.num_v_heads, c.head_v_dim)))
        return self.o_proj(o.flatten(-2))



def l2_normalise(x):
    """fla's l2norm (and the kernels' in-kernel norm): x / sqrt(sum x^2 + 1e-6)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaNet(DeltaRuleMixer):
    """fla/layers/gated_deltanet.py (GatedDeltaNet.forward) with the
    recurrence of fla/ops/gated_delta_rule/fused_recurrent.py, token by token
    (the file docstring has the formulas)."""

    def __init__(self, c):
        super().__init__(c, qk_silu=True)
        self.a_proj = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.b_proj = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(c.num_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(c.num_v_heads))

    def run(self, x, state):
        """x (B, T, hidden) after the state -> (B, T, hidden), new state."""
        c = self.c
        q, k, v, caches = self.qkv(x, state)
        beta = self.b_proj(x).sigmoid()
        if c.allow_neg_eigval:
            beta = beta * 2
        g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        # The kernel's i_h = i_hv // (HV // H).
        groups = c.num_v_heads // c.num_heads
        q = l2_normalise(q.repeat_interleave(groups, dim=2)) * c.head_k_dim ** -0.5
        k = l2_normalise(k.repeat_interleave(groups, dim=2))
        o, s = gated_delta_recurrence(q, k, v, g, beta, state[0])
        return self.finish(o, x), (s, *caches)


class DeltaNet(DeltaRuleMixer):
    """fla/layers/delta_net.py (DeltaNet.forward) with the recurrence of
    fla/ops/delta_rule/fused_recurrent.py: the gated delta rule's loop at
    g = 0 (exp(0) = 1 leaves S as it is)."""

    def __init__(self, c):
        super().__init__(c, qk_silu=c.qk_activation == "silu")
        if c.use_beta:
            self.b_proj = nn.Linear(c.hidden_size, c.num_heads, bias=False)

    def run(self, x, state):
        c = self.c
        q, k, v, caches = self.qkv(x, state)
        if c.qk_activation == "relu":
            q, k = q.relu(), k.relu()
        elif c.qk_activation == "elu":
            q, k = F.elu(q) + 1, F.elu(k) + 1
        if c.qk_norm == "sum":
            q = q / q.sum(-1, keepdim=True)
            k = k / k.sum(-1, keepdim=True)
        else:
            q, k = l2_normalise(q), l2_normalise(k)
        beta = self.b_proj(x).sigmoid() if c.use_beta else torch.ones_like(q[..., 0])
        if c.allow_neg_eigval:
            beta = beta * 2
        q = q * c.head_k_dim ** -0.5
        o, s = gated_delta_recurrence(q, k, v, torch.zeros_like(beta), beta, state[0])
        return self.finish(o, x), (s, *caches)


class Mamba2Mixer(RecurrentMixer):
    """fla/layers/mamba2.py (Mamba2), token by token (the file docstring has
    the formulas). State: S (B, H, P, N) and the convolution's last W-1
    inputs."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        I, H = c.intermediate_size, c.num_heads
        self.in_proj = nn.Linear(c.hidden_size, 2 * I + 2 * c.n_groups * c.state_size + H,
                                 bias=c.use_bias)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.conv_kernel, groups=c.conv_dim,
                                padding=c.conv_kernel - 1, bias=c.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(H))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.D = nn.Parameter(torch.ones(I if c.D_has_hdim else H))
        if c.rmsnorm:
            self.norm = RMSNorm(I, c.norm_eps)  # its weight; grouped below
        self.out_proj = nn.Linear(I, c.hidden_size, bias=c.use_bias)

    def new_state(self, batch, dtype):
        c = self.c
        return (torch.zeros(batch, c.num_heads, c.head_dim, c.state_size, dtype=dtype),
                torch.zeros(batch, c.conv_kernel - 1, c.conv_dim, dtype=dtype))

    def gated_norm(self, y, z):
        """fla/modules/layernorm_gated.py rms_norm_ref with group_size
        I / n_groups."""
        c = self.c
        if not c.rmsnorm:
            return y * F.silu(z)
        if not c.norm_before_gate:
            y = y * F.silu(z)
        g = y.unflatten(-1, (c.n_groups, -1))
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        out = g.flatten(-2) * self.norm.weight
        return out * F.silu(z) if c.norm_before_gate else out

    def run(self, x, state):
        c = self.c
        I, H, P, N, G = c.intermediate_size, c.num_heads, c.head_dim, c.state_size, c.n_groups
        B_, T = x.shape[0], x.shape[1]
        s, cache = state
        z, xbc, dt = self.in_proj(x).split([I, c.conv_dim, H], dim=-1)
        xx = torch.cat([cache, xbc], dim=1)
        w = self.conv1d.weight[:, 0, :]  # (C, W)
        conv = torch.stack([(xx[:, t:t + c.conv_kernel] * w.t()).sum(1) for t in range(T)], 1)
        if c.use_conv_bias:
            conv = conv + self.conv1d.bias
        cache = xx[:, xx.shape[1] - (c.conv_kernel - 1):]
        xs, Bm, Cm = F.silu(conv).split([I, G * N, G * N], dim=-1)
        xs = xs.unflatten(-1, (H, P))
        # Head h reads group h // (H / G).
        Bm = Bm.unflatten(-1, (G, N)).repeat_interleave(H // G, dim=2)
        Cm = Cm.unflatten(-1, (G, N)).repeat_interleave(H // G, dim=2)
        dt = torch.clamp(F.softplus(dt + self.dt_bias), c.dt_limit[0], c.dt_limit[1])
        A = -torch.exp(self.A_log)
        D = self.D.view(H, P) if c.D_has_hdim else self.D[:, None]
        ys = []
        for t in range(T):
            s = (s * torch.exp(dt[:, t] * A)[..., None, None] +
                 dt[:, t, :, None, None] * xs[:, t, :, :, None] * Bm[:, t, :, None, :])
            ys.append(torch.einsum("bhpn,bhn->bhp", s, Cm[:, t]) + D * xs[:, t])
        y = torch.stack(ys, dim=1).reshape(B_, T, I)
        return self.out_proj(self.gated_norm(y, z)), (s, cache)


class Mamba2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mixer = Mamba2Mixer(c)

    def forward(self, x):
        return x + self.mixer(self.norm(x))

    def step(self, x, state):
        o, state = self.mixer.step(self.norm(x), state)
        return x + o, state

    def new_state(self, batch, dtype):
        return self.mixer.new_state(batch, dtype)


class Mamba2Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Mamba2Block(c) for _ in range(c.num_hidden_layers)])
        self.norm_f = RMSNorm(c.hidden_size, c.norm_eps)


# rwkv7, written from fla's RWKV7ForCausalLM (fla/models/rwkv7/modeling_rwkv7.py)
# and RWKV7Attention (fla/layers/rwkv7.py) at bc3b101d, with the ops those
# call: token_shift (fla/modules/token_shift.py: x_{t-1} - x_t, zeros before the
# first token), fused_addcmul_rwkv7 (x + delta * mix), fused_k_rwkv7
# (k.addcmul(k * (a - 1), k_a)), l2_norm (x / sqrt(sum x^2 + 1e-6); F.normalize
# without fuse_norm), gate_output_correction ((o + (r k r_k).sum * v) * g) and
# chunk_rwkv7 (dplr with a = -kk, b = kk * a, scale 1) as the recurrence of
# fla/ops/generalized_delta_rule/dplr/naive.py. tests/python/rwkv7_reference_test.py
# checks it against BlinkDL's own numpy form (RWKV-v7/rwkv_v7_numpy.py).


class LayerNorm(nn.Module):
    """nn.LayerNorm with an optional bias (fla's LayerNorm; torch 1.13's
    nn.LayerNorm always has one)."""

    def __init__(self, dim, eps, bias=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class LoRA(nn.Module):
    """fla/layers/rwkv6.py's LoRA: Linear(in, rank) -> activation -> Linear(rank,
    out) (with bias unless told), as lora.0 and lora.2."""

    def __init__(self, n_in, n_out, rank, activation, bias=True):
        super().__init__()
        act = {None: nn.Identity(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}[activation]
        self.lora = nn.Sequential(nn.Linear(n_in, rank, bias=False), act,
                                  nn.Linear(rank, n_out, bias=bias))

    def forward(self, x):
        return self.lora(x)


def token_shift(x, last):
    """fla's token_shift with a cache: (x_{t-1} - x_t, the last row), x_{-1}
    being `last`."""
    prev = torch.cat([last[:, None], x[:, :-1]], 1)
    return prev - x, x[:, -1]


def dplr_recurrence(q, k, v, alpha, beta, gk, s):
    """fla's dplr_recurrence (B, T, H, D) without its q scaling (chunk_rwkv7
    passes scale 1): S = S exp(gk) + k v^T + beta (alpha^T S), o = q^T S."""
    out = []
    for t in range(q.shape[1]):
        kv = (k[:, t, :, :, None] * v[:, t, :, None, :] +
              (s * alpha[:, t, :, :, None]).sum(-2, keepdim=True) * beta[:, t, :, :, None])
        s = s * gk[:, t].exp()[..., None] + kv
        out.append(torch.einsum("bhd,bhdm->bhm", q[:, t], s))
    return torch.stack(out, 1), s


class RWKV7Attention(nn.Module):
    # The state update over a sequence; tools/train_tiny.py puts its
    # chunkwise form (the same function) here to train on.
    recurrence = staticmethod(dplr_recurrence)

    def __init__(self, c, layer_idx):
        super().__init__()
        self.c, self.layer_idx = c, layer_idx
        h, dv = c.hidden_size, c.value_dim
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            setattr(self, name, nn.Parameter(torch.zeros(1, 1, h)))
        self.k_k = nn.Parameter(torch.zeros(h))
        self.k_a = nn.Parameter(torch.zeros(h))
        self.r_k = nn.Parameter(torch.zeros(c.num_heads, c.head_dim))
        self.r_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, dv, bias=False)
        self.o_proj = nn.Linear(dv, h, bias=False)
        self.w_lora = LoRA(h, h, c.decay_low_rank_dim, "tanh")
        if layer_idx != 0:
            self.v_lora = LoRA(h, dv, c.v_low_rank_dim, None)
        self.a_lora = LoRA(h, h, c.a_low_rank_dim, None)
        self.g_lora = LoRA(h, dv, c.gate_low_rank_dim, "sigmoid", bias=False)
        # fla's GroupNorm(bias=True) or nn.GroupNorm (affine): weight and bias
        # either way, eps head_dim * norm_eps.
        self.g_norm = nn.GroupNorm(c.num_heads, dv, eps=c.head_dim * c.norm_eps)

    def forward(self, x, shift, s, v_first):
        c = self.c
        b, t, _ = x.shape
        nh, dk, dv = c.num_heads, c.head_dim, c.head_v_dim
        delta, shift = token_shift(x, shift)
        xr, xw, xk, xv, xa, xg = (torch.addcmul(x, delta, m) for m in (
            self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        r = self.r_proj(xr)
        w = -0.6065306597126334 * self.w_lora(xw).sigmoid()
        k = self.k_proj(xk)
        v = self.v_proj(xv)
        if self.layer_idx == 0:
            v_first = v
        else:
            v = torch.lerp(v, v_first, self.v_lora(xv).sigmoid())
        a = self.a_lora(xa).sigmoid()
        g = self.g_lora(xg)
        kk = (k * self.k_k).view(b, t, nh, dk)
        if c.fuse_norm:
            kk = kk * torch.rsqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
        else:
            kk = F.normalize(kk, dim=-1, p=2.0)
        k = k.addcmul(k * (a - 1), self.k_a)
        r, w, k, a = (z.view(b, t, nh, dk) for z in (r, w, k, a))
        v = v.view(b, t, nh, dv)
        o, s = self.recurrence(r, k, v, -kk, kk * a, w, s)
        o = self.g_norm(o.reshape(b * t, nh * dv)).view(b, t, nh * dv)
        o = (o + ((r * k * self.r_k).sum(-1, keepdim=True) * v).view(b, t, nh * dv)) * g
        return self.o_proj(o), shift, s, v_first


class RWKV7FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.x_k = nn.Parameter(torch.zeros(c.hidden_size))
        self.key = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.value = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x, shift):
        delta, shift = token_shift(x, shift)
        return self.value(torch.relu(self.key(x.addcmul(delta, self.x_k))) ** 2), shift


class RWKVBlock(nn.Module):
    """fla's RWKV7Block and RWKV6Block: the same skeleton around the type's
    time mix and channel mix. `carry` runs through the layers of one forward
    (RWKV-7's v_first; RWKV-6 has none)."""

    def __init__(self, c, layer_idx, attn, ffn):
        super().__init__()
        h, eps, bias = c.hidden_size, c.norm_eps, c.norm_bias
        self.c = c
        if c.norm_first and layer_idx == 0:
            self.pre_norm = LayerNorm(h, eps, bias)
        self.attn_norm = LayerNorm(h, eps, bias)
        spec = c.attn_layers.get(layer_idx)
        self.attn = SoftmaxAttention(c, spec) if spec else attn(c, layer_idx)
        self.ffn_norm = LayerNorm(h, eps, bias)
        self.ffn = ffn(c)

    def forward(self, x, state, carry):
        attn_shift, ffn_shift, s = state
        residual = self.pre_norm(x) if hasattr(self, "pre_norm") else x
        if isinstance(self.attn, SoftmaxAttention):
            # A hybrid's attention layer: no time-mix shift; s is its keys
            # and values.
            o, s = self.attn.run(self.attn_norm(residual), s)
        else:
            o, attn_shift, s, carry = self.attn(self.attn_norm(residual), attn_shift, s, carry)
        x = residual + o
        f, ffn_shift = self.ffn(self.ffn_norm(x), ffn_shift)
        return x + f, (attn_shift, ffn_shift, s), carry

    def new_state(self, batch, dtype):
        c = self.c
        s = (self.attn.new_state(batch, dtype) if isinstance(self.attn, SoftmaxAttention) else
             torch.zeros(batch, c.num_heads, c.head_k_dim, c.head_v_dim, dtype=dtype))
        return (torch.zeros(batch, c.hidden_size, dtype=dtype),
                torch.zeros(batch, c.hidden_size, dtype=dtype), s)


class RWKVBackbone(nn.Module):
    def __init__(self, c, attn, ffn):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([RWKVBlock(c, i, attn, ffn)
                                     for i in range(c.num_hidden_layers)])
        self.norm = LayerNorm(c.hidden_size, c.norm_eps, c.norm_bias)


# rwkv6, written from fla's RWKV6ForCausalLM (fla/models/rwkv6/modeling_rwkv6.py),
# RWKV6FeedForward there, and RWKV6Attention, LerpLinear, DDLerpLinear and LoRA
# (fla/layers/rwkv6.py) at bc3b101d, with chunk_rwkv6 (scale 1) as the
# recurrence of fla/ops/rwkv6/recurrent_naive.py. fla's GroupNorm(num_heads,
# value_dim, bias=True, eps=norm_eps) normalises each head's values.
# tests/python/rwkv6_reference_test.py checks the recurrence against
# BlinkDL's own statement (RWKV-v5/rwkv_v6_demo.py).


class LerpLinear(nn.Module):
    """fla's LerpLinear: linear(x + delta * mu), linear a bias-free Linear or
    (low_rank_dim) a tanh LoRA."""

    def __init__(self, n_in, n_out, rank=None):
        super().__init__()
        self.linear = (nn.Linear(n_in, n_out, bias=False) if rank is None
                       else LoRA(n_in, n_out, rank, "tanh"))
        self.mu = nn.Parameter(torch.zeros(n_in))

    def forward(self, x, delta):
        return self.linear(x + delta * self.mu)


class DDLerpLinear(nn.Module):
    """fla's DDLerpLinear: linear(x + delta * mu) with mu given per token."""

    def __init__(self, n_in, n_out, rank=None):
        super().__init__()
        self.linear = (nn.Linear(n_in, n_out, bias=False) if rank is None
                       else LoRA(n_in, n_out, rank, "tanh"))

    def forward(self, x, mu, delta):
        return self.linear(x + delta * mu)


def rwkv6_recurrence(r, k, v, w, u, s):
    """fla's naive_recurrent_rwkv6 on (B, T, H, D) with scale 1:
    o = sum_K (h + u kv) q;  h = h exp(w) + kv."""
    out = []
    for t in range(r.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(((s + u[None, :, :, None] * kv) * r[:, t, :, :, None]).sum(-2))
        s = s * w[:, t].exp()[..., None] + kv
    return torch.stack(out, 1), s


class RWKV6Attention(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.c = c
        h, rank = c.hidden_size, c.proj_low_rank_dim
        self.x_proj = nn.Sequential(LerpLinear(h, rank * 5), nn.Tanh(),
                                    nn.Linear(rank * 5, h, bias=False))
        self.x_bias = nn.Parameter(torch.zeros(5, h))
        self.r_proj = DDLerpLinear(h, c.key_dim)
        self.w_proj = DDLerpLinear(h, c.key_dim, c.gate_low_rank_dim)
        self.k_proj = DDLerpLinear(h, c.key_dim)
        self.v_proj = DDLerpLinear(h, c.value_dim)
        self.g_proj = DDLerpLinear(h, c.value_dim)
        self.bonus = nn.Parameter(torch.zeros(c.num_heads, c.head_k_dim))
        self.g_norm = nn.GroupNorm(c.num_heads, c.value_dim, eps=c.group_norm_eps)
        self.o_proj = nn.Linear(c.value_dim, h, bias=False)

    def forward(self, x, shift, s, carry=None):
        c = self.c
        b, t, h = x.shape
        nh = c.num_heads
        delta, shift = token_shift(x, shift)
        xx = self.x_proj[0](x, delta).view(b, t, -1, c.proj_low_rank_dim)
        xx = torch.einsum("btnr,hnr->btnh", self.x_proj[1](xx),
                          self.x_proj[2].weight.view(h, 5, -1))
        mr, mw, mk, mv, mg = (xx + self.x_bias).unbind(-2)
        r = self.r_proj(x, mr, delta).view(b, t, nh, c.head_k_dim)
        w = -torch.exp(self.w_proj(x, mw, delta)).view(b, t, nh, c.head_k_dim)
        k = self.k_proj(x, mk, delta).view(b, t, nh, c.head_k_dim)
        v = self.v_proj(x, mv, delta).view(b, t, nh, c.head_v_dim)
        g = self.g_proj(x, mg, delta)
        o, s = rwkv6_recurrence(r, k, v, w, self.bonus, s)
        o = self.g_norm(o.reshape(b * t, c.value_dim)).view(b, t, c.value_dim) * F.silu(g)
        return self.o_proj(o), shift, s, carry


class RWKV6FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c.hidden_size
        self.key = LerpLinear(h, c.intermediate_size)
        self.value = nn.Linear(c.intermediate_size, h, bias=False)
        self.receptance = LerpLinear(h, h)

    def forward(self, x, shift):
        delta, shift = token_shift(x, shift)
        key = torch.relu(self.key(x, delta)) ** 2
        return self.receptance(x, delta).sigmoid() * self.value(key), shift


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SoftmaxAttention(nn.Module):
    """fla's Attention (fla/layers/attn.py) in a hybrid's layer; its state
    is every key and value so far (rotary applied) and the position."""

    def __init__(self, c, spec):
        super().__init__()
        h = c.hidden_size
        self.num_heads, self.num_kv_heads = spec["num_heads"], spec["num_kv_heads"]
        self.head_dim = h // self.num_heads
        self.window = spec["window_size"]
        self.theta = spec["rope_theta"]
        kv = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(h, h, bias=spec["qkv_bias"])
        self.k_proj = nn.Linear(h, kv, bias=spec["qkv_bias"])
        self.v_proj = nn.Linear(h, kv, bias=spec["qkv_bias"])
        self.o_proj = nn.Linear(h, h, bias=False)

    def new_state(self, batch, dtype):
        empty = torch.zeros(batch, 0, self.num_kv_heads, self.head_dim, dtype=dtype)
        return (empty, empty.clone(), 0)

    def forward(self, x):
        return self.run(x, self.new_state(x.shape[0], x.dtype))[0]

    def step(self, x, state):
        out, state = self.run(x[:, None], state)
        return out[:, 0], state

    def run(self, x, state):
        keys, values, position = state
        b, t, _ = x.shape
        d = self.head_dim
        q = rotary(self.q_proj(x).view(b, t, self.num_heads, d), position, self.theta)
        k = rotary(self.k_proj(x).view(b, t, self.num_kv_heads, d), position, self.theta)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, d)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        # Query i (position position + i) sees key j (position j) for
        # i - window < j <= i.
        qpos = torch.arange(position, position + t)[:, None]
        kpos = torch.arange(keys.shape[1])[None, :]
        allowed = kpos <= qpos
        if self.window is not None:
            allowed = allowed & (kpos > qpos - self.window)
        group = self.num_heads // self.num_kv_heads
        kh = keys.repeat_interleave(group, dim=2)  # query head h reads key head h // group
        vh = values.repeat_interleave(group, dim=2)
        scores = torch.einsum("bihd,bjhd->bhij", q, kh) * d ** -0.5
        scores = scores.masked_fill(~allowed, -math.inf)
        o = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), vh)
        return self.o_proj(o.reshape(b, t, -1)), (keys, values, position + t)


class Block(nn.Module):
    def __init__(self, c, layer_idx=0):
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden_size, c.norm_eps)
        spec = c.attn_layers.get(layer_idx)
        self.attn = SoftmaxAttention(c, spec) if spec else MODEL_TYPES[c.model_type].mixer(c)
        self.mlp_norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x, state):
        o, state = self.attn.step(self.attn_norm(x), state)
        x = x + o
        return x + self.mlp(self.mlp_norm(x)), state

    def new_state(self, batch, dtype):
        return self.attn.new_state(batch, dtype)


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Block(c, i) for i in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)


class CausalLM(nn.Module):
    """Embeddings, blocks (each with forward, step and new_state), a final
    norm and lm_head; subclasses name the parts as fla's checkpoints do."""

    def __init__(self, c, backbone, norm_name):
        super().__init__()
        self.c = c
        self.backbone_name = ("model" if isinstance(backbone, (Backbone, RWKVBackbone,
                                                               TransformersModel))
                              else "backbone")
        setattr(self, self.backbone_name, backbone)
        self.norm_name = norm_name
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = backbone.embeddings.weight

    @property
    def embeddings_name(self):
        return f"{self.backbone_name}.embeddings.weight"

    def parts(self):
        backbone = getattr(self, self.backbone_name)
        return backbone.embeddings, backbone.layers, getattr(backbone, self.norm_name)

    def embed(self, tokens):
        return self.parts()[0](tokens)

    def head(self, x):
        """The last hidden states (after the final norm) -> logits."""
        return self.lm_head(x)

    def forward(self, tokens):
        """tokens (B, T) -> logits (B, T, vocab)."""
        embeddings, layers, norm = self.parts()
        x = self.embed(tokens)
        for layer in layers:
            x = layer(x)
        return self.head(norm(x))

    def new_state(self, batch, dtype=torch.float32):
        return [layer.new_state(batch, dtype) for layer in self.parts()[1]]

    def step(self, tokens, states):
        """One token per sequence, tokens (B,) -> logits (B, vocab), new states."""
        embeddings, layers, norm = self.parts()
        x = self.embed(tokens)
        out = []
        for layer, st in zip(layers, states):
            x, st = layer.step(x, st)
            out.append(st)
        return self.head(norm(x)), out

    def state_dict_for_export(self):
        sd = {k: v.detach().float().numpy() for k, v in self.state_dict().items()}
        if self.c.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        if getattr(self.c, "tie_feature_map_qk", False):
            for k in [k for k in sd if ".attn.feature_map_k." in k]:
                sd.pop(k)
        return sd


class LinearAttentionLM(CausalLM):
    """fla's *ForCausalLM of the attention-style models: model.embeddings,
    model.layers (attn_norm, attn, mlp_norm, mlp), model.norm."""

    def __init__(self, c):
        super().__init__(c, Backbone(c), "norm")


class Mamba2LM(CausalLM):
    """fla's Mamba2ForCausalLM: backbone.embeddings, backbone.layers (norm,
    mixer), backbone.norm_f."""

    def __init__(self, c):
        super().__init__(c, Mamba2Backbone(c), "norm_f")


class RWKVLM(CausalLM):
    """fla's RWKV7ForCausalLM and RWKV6ForCausalLM: model.embeddings,
    model.layers (pre_norm on the first with norm_first, attn_norm, attn,
    ffn_norm, ffn), model.norm. Each layer's state is its two token-shift
    rows and S; RWKV-7's v_first runs through the layers of one forward."""

    def __init__(self, c, attn, ffn):
        super().__init__(c, RWKVBackbone(c, attn, ffn), "norm")

    def run(self, tokens, states):
        embeddings, layers, norm = self.parts()
        x = embeddings(tokens)
        carry, out = None, []
        for layer, st in zip(layers, states):
            x, st, carry = layer(x, st, carry)
            out.append(st)
        return self.lm_head(norm(x)), out

    def forward(self, tokens):
        dtype = self.lm_head.weight.dtype
        return self.run(tokens, self.new_state(tokens.shape[0], dtype))[0]

    def step(self, tokens, states):
        logits, states = self.run(tokens[:, None], states)
        return logits[:, 0], states


class RWKV7LM(RWKVLM):
    def __init__(self, c):
        super().__init__(c, RWKV7Attention, RWKV7FeedForward)


class RWKV6LM(RWKVLM):
    def __init__(self, c):
        super().__init__(c, RWKV6Attention, RWKV6FeedForward)

# granitemoehybrid, written from transformers' GraniteMoeHybridForCausalLM
# (src/transformers/models/granitemoehybrid/modeling_granitemoehybrid.py, the
# version whose Mamba layer reads config.time_step_limit and whose rotary reads
# config.rope_parameters) and configuration_granitemoehybrid.py. Checkpoint
# names are transformers' own: model.embed_tokens, model.layers.N.{
# input_layernorm, mamba | self_attn, post_attention_layernorm,
# block_sparse_moe, shared_mlp}, model.norm, lm_head.


class GraniteMoeHybridMambaLayer(RecurrentMixer):
    """GraniteMoeHybridMambaLayer as its torch_forward computes a cached
    decode step (use_precomputed_states), one token at a time; its chunked
    scan over a sequence (segment_sum) is the same recurrence,
    tests/python/granitemoehybrid_reference_test.py checks the two agree.
    in_proj(x) -> [gate (I) | xBC (I + 2 G N) | dt (H)]; xBC through the
    depthwise causal conv1d (its bias with mamba_conv_bias) and hidden_act;
    -> [x (H heads of P) | B (G x N) | C (G x N)], head h reading group
    h // (H / G);  dt = clamp(softplus(dt + dt_bias), time_step_limit),
    A = -exp(A_log):
        S = exp(dt A) S + dt x_h B^T;   y_h = S C + D_h x_h
    then GraniteMoeHybridRMSNormGated over all I channels (one group, whatever
    mamba_n_groups): rmsnorm(y * silu(gate)) * weight; out_proj. in_proj and
    out_proj have biases with mamba_proj_bias. State: S (B, H, P, N) and the
    convolution's last W-1 inputs."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        I, H = c.mamba_intermediate, c.mamba_n_heads
        self.in_proj = nn.Linear(c.hidden_size, I + c.mamba_conv_dim + H, bias=c.mamba_proj_bias)
        self.conv1d = nn.Conv1d(c.mamba_conv_dim, c.mamba_conv_dim, c.mamba_d_conv,
                                groups=c.mamba_conv_dim, padding=c.mamba_d_conv - 1,
                                bias=c.mamba_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(H))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, H + 1, dtype=torch.float32)))
        self.norm = RMSNorm(I, c.norm_eps)  # its weight; the gated norm is gated_norm
        self.D = nn.Parameter(torch.ones(H))
        self.out_proj = nn.Linear(I, c.hidden_size, bias=c.mamba_proj_bias)

    def new_state(self, batch, dtype):
        c = self.c
        return (torch.zeros(batch, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, dtype=dtype),
                torch.zeros(batch, c.mamba_d_conv - 1, c.mamba_conv_dim, dtype=dtype))

    def gated_norm(self, y, gate):
        """GraniteMoeHybridRMSNormGated(y, gate): the gate (silu) before the
        norm, mean over the whole last dimension."""
        y = y * F.silu(gate)
        return self.norm.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) +
                                                   self.c.norm_eps))

    def run(self, x, state):
        c = self.c
        I, H, P, N, G = (c.mamba_intermediate, c.mamba_n_heads, c.mamba_d_head,
                         c.mamba_d_state, c.mamba_n_groups)
        b, T = x.shape[0], x.shape[1]
        s, window = state
        gate, xbc, dt = self.in_proj(x).split([I, c.mamba_conv_dim, H], dim=-1)
        w = self.conv1d.weight[:, 0, :].t()  # (W, C): tap j reads input t - (W-1) + j
        A = -torch.exp(self.A_log)
        ys = []
        for t in range(T):
            # The cache's roll: the new input last, then sum over the taps.
            full = torch.cat([window, xbc[:, t:t + 1]], dim=1)  # (B, W, C)
            window = full[:, 1:]
            conv = (full * w).sum(1)
            if c.mamba_conv_bias:
                conv = conv + self.conv1d.bias
            xs, Bm, Cm = F.silu(conv).split([I, G * N, G * N], dim=-1)
            xs = xs.view(b, H, P)
            Bm = Bm.view(b, G, N).repeat_interleave(H // G, dim=1)  # (B, H, N)
            Cm = Cm.view(b, G, N).repeat_interleave(H // G, dim=1)
            dt_t = F.softplus(dt[:, t] + self.dt_bias)
            dt_t = torch.clamp(dt_t, c.time_step_limit[0], c.time_step_limit[1])  # (B, H)
            dA = torch.exp(dt_t * A)
            s = (s * dA[:, :, None, None] +
                 (dt_t[:, :, None] * Bm)[:, :, None, :] * xs[..., None])
            y = (s * Cm[:, :, None, :]).sum(-1) + xs * self.D[:, None]
            ys.append(y.reshape(b, I))
        y = torch.stack(ys, dim=1)
        return self.out_proj(self.gated_norm(y, gate)), (s, window)


class GraniteMoeHybridAttention(nn.Module):
    """GraniteMoeHybridAttention (eager): q, k, v, o projections (all four
    with bias for attention_bias), num_attention_heads query heads and
    num_key_value_heads key/value heads of head_dim (query head h reads key
    head h // (heads / kv_heads), repeat_kv), rotary (GPT-NeoX halves over
    the whole head, tables in float32, `rotary`) only for
    position_embedding_type "rope", causal softmax of q.k *
    attention_multiplier (in place of head_dim^-1/2). State: every key
    (rotary applied) and value so far, and the position."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h, d = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(h, c.num_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * d, h, bias=c.attention_bias)

    def new_state(self, batch, dtype):
        empty = torch.zeros(batch, 0, self.c.num_kv_heads, self.c.head_dim, dtype=dtype)
        return (empty, empty.clone(), 0)

    def run(self, x, state):
        c = self.c
        keys, values, position = state
        b, t, _ = x.shape
        d = c.head_dim
        q = self.q_proj(x).view(b, t, c.num_heads, d)
        k = self.k_proj(x).view(b, t, c.num_kv_heads, d)
        v = self.v_proj(x).view(b, t, c.num_kv_heads, d)
        if c.rope:
            # position_ids = cache_position: the tokens' absolute positions.
            q, k = rotary(q, position, c.rope_theta), rotary(k, position, c.rope_theta)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        group = c.num_heads // c.num_kv_heads
        kh = keys.repeat_interleave(group, dim=2)
        vh = values.repeat_interleave(group, dim=2)
        scores = torch.einsum("bihd,bjhd->bhij", q, kh) * c.attention_multiplier
        qpos = torch.arange(position, position + t)[:, None]
        kpos = torch.arange(keys.shape[1])[None, :]
        scores = scores.masked_fill(~(kpos <= qpos), -math.inf)
        o = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), vh)
        return self.o_proj(o.reshape(b, t, -1)), (keys, values, position + t)


class GraniteMoeHybridParallelExperts(nn.Module):
    """GraniteMoeHybridParallelExperts: weight (num_experts, out, in)."""

    def __init__(self, num_experts, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, n_out, n_in))


class GraniteMoeHybridTopKGating(nn.Module):
    """GraniteMoeHybridTopKGating: logits = layer(x) (Linear without bias),
    the top k of them, softmax over those k only."""

    def __init__(self, c):
        super().__init__()
        self.top_k = c.num_experts_per_tok
        self.layer = nn.Linear(c.hidden_size, c.num_local_experts, bias=False)

    def forward(self, x):
        """x (N, hidden) -> expert indices (N, k), gates (N, k)."""
        top, index = self.layer(x).topk(self.top_k, dim=-1)
        return index, top.softmax(-1)


class GraniteMoeHybridMoE(nn.Module):
    """GraniteMoeHybridMoE: per token, the sum over its top-k experts e of
    gate_e * output_linear[e] (act(a) * b), [a | b] = input_linear[e] x
    (the first intermediate_size rows act, the second half multiplies)."""

    def __init__(self, c):
        super().__init__()
        E, D, I = c.num_local_experts, c.hidden_size, c.intermediate_size
        self.input_linear = GraniteMoeHybridParallelExperts(E, D, 2 * I)
        self.output_linear = GraniteMoeHybridParallelExperts(E, I, D)
        self.router = GraniteMoeHybridTopKGating(c)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        index, gates = self.router(x)
        out = torch.zeros_like(x)
        for e in range(self.input_linear.weight.shape[0]):
            rows, slot = (index == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            a, b = F.linear(x[rows], self.input_linear.weight[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(a) * b, self.output_linear.weight[e])
            out.index_add_(0, rows, y * gates[rows, slot, None])
        return out.view(shape)


class GraniteMoeHybridMLP(nn.Module):
    """GraniteMoeHybridMLP (the shared MLP): output_linear(act(a) * b),
    [a | b] = input_linear(x), Linears without bias."""

    def __init__(self, c):
        super().__init__()
        S = c.shared_intermediate_size
        self.input_linear = nn.Linear(c.hidden_size, 2 * S, bias=False)
        self.output_linear = nn.Linear(S, c.hidden_size, bias=False)

    def forward(self, x):
        a, b = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(a) * b)


class DecoderLayer(nn.Module):
    """A transformers decoder layer run over a sequence from its mixer's
    state (`run(x, state)` by the subclass): the whole sequence from a new
    state, or one token's step."""

    def forward(self, x):
        return self.run(x, self.new_state(x.shape[0], x.dtype))[0]

    def step(self, x, state):
        out, state = self.run(x[:, None], state)
        return out[:, 0], state

    def new_state(self, batch, dtype):
        return self.mixer.new_state(batch, dtype)


class GraniteMoeHybridDecoderLayer(DecoderLayer):
    """GraniteMoeHybridDecoderLayer:
        x = x + residual_multiplier * mixer(input_layernorm(x))
        x = x + residual_multiplier * ffn(post_attention_layernorm(x))
    mixer the Mamba layer or the attention (layer_types); ffn = moe(h) +
    shared_mlp(h) with experts, shared_mlp(h) without (num_local_experts 0).
    transformers builds shared_mlp always; of shared_intermediate_size 0 it
    adds zero, and here it is left out (no tensors)."""

    def __init__(self, c, layer_idx):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        if c.layer_types[layer_idx] == "mamba":
            self.mamba = GraniteMoeHybridMambaLayer(c)
        else:
            self.self_attn = GraniteMoeHybridAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        if c.num_local_experts > 0:
            self.block_sparse_moe = GraniteMoeHybridMoE(c)
        if c.shared_intermediate_size > 0:
            self.shared_mlp = GraniteMoeHybridMLP(c)

    @property
    def mixer(self):
        return self.mamba if hasattr(self, "mamba") else self.self_attn

    def ffn(self, h):
        out = torch.zeros_like(h)
        if hasattr(self, "block_sparse_moe"):
            out = self.block_sparse_moe(h)
        if hasattr(self, "shared_mlp"):
            out = out + self.shared_mlp(h)
        return out

    def run(self, x, state):
        m = self.c.residual_multiplier
        o, state = self.mixer.run(self.input_layernorm(x), state)
        x = x + o * m
        return x + self.ffn(self.post_attention_layernorm(x)) * m, state



class TransformersModel(nn.Module):
    """A transformers decoder stack in its names: embed_tokens, layers (of
    `layer`), norm (of `norm`)."""

    def __init__(self, c, layer, norm):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([layer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = norm(c.hidden_size, c.norm_eps)

    @property
    def embeddings(self):
        return self.embed_tokens


class GraniteMoeHybridModel(TransformersModel):
    def __init__(self, c):
        super().__init__(c, GraniteMoeHybridDecoderLayer, RMSNorm)


class GraniteMoeHybridLM(CausalLM):
    """GraniteMoeHybridForCausalLM: embed_tokens(tokens) * embedding_multiplier,
    the layers, model.norm, lm_head(x) / logits_scaling (lm_head tied to
    embed_tokens with tie_word_embeddings)."""

    def __init__(self, c):
        super().__init__(c, GraniteMoeHybridModel(c), "norm")

    @property
    def embeddings_name(self):
        return "model.embed_tokens.weight"

    def embed(self, tokens):
        return self.model.embed_tokens(tokens) * self.c.embedding_multiplier

    def head(self, x):
        return self.lm_head(x) / self.c.logits_scaling


# qwen3_next, written from transformers' Qwen3NextForCausalLM
# (src/transformers/models/qwen3_next/modeling_qwen3_next.py, the version
# whose experts are 3-D tensors and whose rotary reads config.rope_parameters)
# and configuration_qwen3_next.py. Checkpoint names are the Hub's:
# model.embed_tokens, model.layers.N.{input_layernorm, linear_attn |
# self_attn, post_attention_layernorm, mlp}, model.norm, lm_head; the experts
# per expert (mlp.experts.E.{gate,up,down}_proj.weight) or, as transformers v5
# holds them, fused (mlp.experts.gate_up_proj (E, 2I, H), gate rows first, and
# mlp.experts.down_proj (E, H, I)). The model holds them fused.


class Qwen3NextRMSNorm(nn.Module):
    """Qwen3NextRMSNorm: zero-centred, x rsqrt(mean x^2 + eps) (1 + weight),
    its weight 0 at initialisation (the layers' norms, model.norm, q_norm and
    k_norm)."""

    zero_centred = True

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class Qwen3NextRMSNormGated(nn.Module):
    """Qwen3NextRMSNormGated(x, gate): the norm first, then its weight (1 at
    initialisation, not zero-centred), then times silu(gate):
    weight * x rsqrt(mean x^2 + eps) * silu(gate), per head of the rule's
    output (one weight of head_v_dim for every head)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, gate):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x * F.silu(gate)


def partial_rotary(x, position, base, rotary_dim):
    """Qwen3NextRotaryEmbedding with apply_rotary_pos_emb on x (B, T, H, d),
    tokens at positions position, position + 1, ...: `rotary` (tables in
    float32, GPT-NeoX halves, inverse frequencies over rotary_dim) on the
    first rotary_dim channels of each head, the others passed through."""
    if rotary_dim == 0:
        return x
    return torch.cat([rotary(x[..., :rotary_dim], position, base), x[..., rotary_dim:]], dim=-1)


class Qwen3NextGatedDeltaNet(RecurrentMixer):
    """Qwen3NextGatedDeltaNet, token by token (the recurrence of
    torch_recurrent_gated_delta_rule, which its cached decode step runs; its
    chunked prefill, torch_chunk_gated_delta_rule, is the same function of
    the sequence, tests/python/qwen3_next_reference_test.py checks the two
    agree). Hk = linear_num_key_heads, Hv = linear_num_value_heads,
    r = Hv / Hk, dk, dv the head dims:
      in_proj_qkvz(x) per key head i: [q_i (dk) | k_i (dk) | v (r dv) | z (r dv)]
      (value heads i r .. i r + r - 1), in_proj_ba(x) per key head:
      [b (r) | a (r)] (fix_query_key_value_ordering);
      [q | k | v] (all of q's heads, then k's, then v's) through the
      depthwise causal conv1d of linear_conv_kernel_dim taps (no bias) and
      SiLU; beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias);
      value head j reads q/k head j // r (repeat_interleave); q and k
      L2-normalised (x rsqrt(sum x^2 + 1e-6)), q times dk^-1/2:
        S = exp(g) S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
      then Qwen3NextRMSNormGated(o, z) per value head, and out_proj.
    State: (S (B, Hv, dk, dv), the key dimension first as transformers'
    last_recurrent_state; the convolution's last K-1 inputs (B, K-1,
    conv_dim), the oldest first)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h, K = c.hidden_size, c.linear_conv_kernel_dim
        self.in_proj_qkvz = nn.Linear(h, 2 * c.linear_key_dim + 2 * c.linear_value_dim,
                                      bias=False)
        self.in_proj_ba = nn.Linear(h, 2 * c.linear_num_value_heads, bias=False)
        self.conv1d = nn.Conv1d(c.linear_conv_dim, c.linear_conv_dim, K, groups=c.linear_conv_dim,
                                padding=K - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(c.linear_num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(c.linear_num_value_heads))
        self.norm = Qwen3NextRMSNormGated(c.linear_value_head_dim, c.norm_eps)
        self.out_proj = nn.Linear(c.linear_value_dim, h, bias=False)

    def new_state(self, batch, dtype):
        c = self.c
        return (torch.zeros(batch, c.linear_num_value_heads, c.linear_key_head_dim,
                            c.linear_value_head_dim, dtype=dtype),
                torch.zeros(batch, c.linear_conv_kernel_dim - 1, c.linear_conv_dim, dtype=dtype))

    def projections(self, x):
        """fix_query_key_value_ordering: x (B, T, hidden) -> q, k (B, T, Hk dk),
        v (B, T, Hv dv), z (B, T, Hv, dv), b, a (B, T, Hv)."""
        c = self.c
        b, t, _ = x.shape
        Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        r = Hv // Hk
        per_key_head = self.in_proj_qkvz(x).view(b, t, Hk, 2 * dk + 2 * r * dv)
        q, k, v, z = per_key_head.split([dk, dk, r * dv, r * dv], dim=-1)
        beta_in, a = self.in_proj_ba(x).view(b, t, Hk, 2 * r).split([r, r], dim=-1)
        return (q.reshape(b, t, Hk * dk), k.reshape(b, t, Hk * dk), v.reshape(b, t, Hv * dv),
                z.reshape(b, t, Hv, dv), beta_in.reshape(b, t, Hv), a.reshape(b, t, Hv))

    def run(self, x, state):
        c = self.c
        b, T, _ = x.shape
        Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        s, window = state
        q, k, v, z, beta_in, a = self.projections(x)
        mixed = torch.cat([q, k, v], dim=-1)
        w = self.conv1d.weight[:, 0, :].t()  # (K, C): tap j reads input t - (K-1) + j
        conv = []
        for t in range(T):
            full = torch.cat([window, mixed[:, t:t + 1]], dim=1)  # (B, K, C)
            window = full[:, 1:]
            conv.append((full * w).sum(1))
        mixed = F.silu(torch.stack(conv, dim=1))
        q, k, v = mixed.split([c.linear_key_dim, c.linear_key_dim, c.linear_value_dim], dim=-1)
        beta = beta_in.sigmoid()
        g = -self.A_log.exp() * F.softplus(a + self.dt_bias)
        r = Hv // Hk
        q = q.reshape(b, T, Hk, dk).repeat_interleave(r, dim=2)
        k = k.reshape(b, T, Hk, dk).repeat_interleave(r, dim=2)
        v = v.reshape(b, T, Hv, dv)
        q = l2_normalise(q) * dk ** -0.5
        k = l2_normalise(k)
        o, s = gated_delta_recurrence(q, k, v, g, beta, s)
        o = self.norm(o, z)
        return self.out_proj(o.reshape(b, T, c.linear_value_dim)), (s, window)


class Qwen3NextAttention(nn.Module):
    """Qwen3NextAttention (eager): q_proj gives 2 head_dim per query head,
    the query then its output gate ([q_h | gate_h] for each head h in turn);
    k_proj, v_proj num_key_value_heads heads of head_dim (all four projections
    with bias for attention_bias); q_norm and k_norm (Qwen3NextRMSNorm over
    each head's head_dim) before the partial rotary (`partial_rotary`); causal
    softmax of q.k head_dim^-1/2 (query head h reads key head
    h // (heads / kv_heads)); the output times sigmoid(gate), then o_proj.
    State: every key (normed, rotary applied) and value so far, and the
    position."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h, d = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(h, c.num_heads * d * 2, bias=c.attention_bias)
        self.k_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * d, h, bias=c.attention_bias)
        self.q_norm = Qwen3NextRMSNorm(d, c.norm_eps)
        self.k_norm = Qwen3NextRMSNorm(d, c.norm_eps)

    def new_state(self, batch, dtype):
        empty = torch.zeros(batch, 0, self.c.num_kv_heads, self.c.head_dim, dtype=dtype)
        return (empty, empty.clone(), 0)

    def run(self, x, state):
        c = self.c
        keys, values, position = state
        b, t, _ = x.shape
        d, H = c.head_dim, c.num_heads
        q, gate = self.q_proj(x).view(b, t, H, 2 * d).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(b, t, c.num_kv_heads, d))
        v = self.v_proj(x).view(b, t, c.num_kv_heads, d)
        q = partial_rotary(q, position, c.rope_theta, c.rotary_dim)
        k = partial_rotary(k, position, c.rope_theta, c.rotary_dim)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        group = H // c.num_kv_heads
        kh = keys.repeat_interleave(group, dim=2)
        vh = values.repeat_interleave(group, dim=2)
        scores = torch.einsum("bihd,bjhd->bhij", q, kh) * d ** -0.5
        qpos = torch.arange(position, position + t)[:, None]
        kpos = torch.arange(keys.shape[1])[None, :]
        scores = scores.masked_fill(~(kpos <= qpos), -math.inf)
        o = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), vh)
        o = o.reshape(b, t, H * d) * torch.sigmoid(gate.reshape(b, t, H * d))
        return self.o_proj(o), (keys, values, position + t)


class Qwen3NextMLP(nn.Module):
    """Qwen3NextMLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases
    (the dense layers' MLP of intermediate_size; the shared expert of
    shared_expert_intermediate_size)."""

    def __init__(self, c, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3NextExperts(nn.Module):
    """Qwen3NextExperts: gate_up_proj (E, 2I, H), the gate's I rows first,
    and down_proj (E, H, I); expert e gives
    down_proj[e] (silu(gate) * up), [gate | up] = gate_up_proj[e] x."""

    def __init__(self, c):
        super().__init__()
        E, H, I = c.num_experts, c.hidden_size, c.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.zeros(E, H, I))

    def forward(self, x, index, weights):
        """x (N, H), the chosen experts (N, k) and their weights (N, k)."""
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            rows, slot = (index == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            gate, up = F.linear(x[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e])
            out.index_add_(0, rows, y * weights[rows, slot, None])
        return out


class Qwen3NextTopKRouter(nn.Module):
    """Qwen3NextTopKRouter: softmax over all num_experts of x W^T (weight
    (E, H), no bias), then its top num_experts_per_tok; those renormalised to
    sum 1 with norm_topk_prob, else kept as they are."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.zeros(c.num_experts, c.hidden_size))

    def forward(self, x):
        """x (N, H) -> expert indices (N, k), their weights (N, k)."""
        probs = F.linear(x, self.weight).softmax(-1)
        top, index = probs.topk(self.c.num_experts_per_tok, dim=-1)
        if self.c.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        return index, top


class Qwen3NextSparseMoeBlock(nn.Module):
    """Qwen3NextSparseMoeBlock: experts(x) weighted by the router (`gate`),
    plus shared_expert(x) * sigmoid(shared_expert_gate(x)) (a Linear H -> 1
    without bias)."""

    def __init__(self, c):
        super().__init__()
        self.gate = Qwen3NextTopKRouter(c)
        self.experts = Qwen3NextExperts(c)
        self.shared_expert = Qwen3NextMLP(c, c.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(c.hidden_size, 1, bias=False)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        index, weights = self.gate(x)
        out = self.experts(x, index, weights)
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.view(shape)


class Qwen3NextDecoderLayer(DecoderLayer):
    """Qwen3NextDecoderLayer:
        x = x + mixer(input_layernorm(x))
        x = x + mlp(post_attention_layernorm(x))
    mixer linear_attn (Qwen3NextGatedDeltaNet) or self_attn (layer_types);
    mlp the sparse MoE block or a dense Qwen3NextMLP (Config.moe_layers)."""

    def __init__(self, c, layer_idx):
        super().__init__()
        self.input_layernorm = Qwen3NextRMSNorm(c.hidden_size, c.norm_eps)
        if c.layer_types[layer_idx] == "linear_attention":
            self.linear_attn = Qwen3NextGatedDeltaNet(c)
        else:
            self.self_attn = Qwen3NextAttention(c)
        self.post_attention_layernorm = Qwen3NextRMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = (Qwen3NextSparseMoeBlock(c) if c.moe_layers[layer_idx]
                    else Qwen3NextMLP(c, c.intermediate_size))

    @property
    def mixer(self):
        return self.linear_attn if hasattr(self, "linear_attn") else self.self_attn

    def run(self, x, state):
        o, state = self.mixer.run(self.input_layernorm(x), state)
        x = x + o
        return x + self.mlp(self.post_attention_layernorm(x)), state



class Qwen3NextModel(TransformersModel):
    def __init__(self, c):
        super().__init__(c, Qwen3NextDecoderLayer, Qwen3NextRMSNorm)


QWEN3_NEXT_EXPERT_LAYOUTS = ("split", "fused")


class Qwen3NextLM(CausalLM):
    """Qwen3NextForCausalLM: embed_tokens, the layers, model.norm (zero-centred),
    lm_head (tied to embed_tokens with tie_word_embeddings). Reads the experts
    in either layout (the Hub's per-expert names or v5's fused ones) and
    writes the per-expert names unless told "fused"."""

    def __init__(self, c):
        super().__init__(c, Qwen3NextModel(c), "norm")

    @property
    def embeddings_name(self):
        return "model.embed_tokens.weight"

    def state_dict_for_export(self, experts="split"):
        if experts not in QWEN3_NEXT_EXPERT_LAYOUTS:
            raise ValueError(f"experts layout {experts!r}: one of {QWEN3_NEXT_EXPERT_LAYOUTS}")
        sd = super().state_dict_for_export()
        if experts == "fused":
            return sd
        for name in [n for n in sd if n.endswith(".mlp.experts.gate_up_proj")]:
            prefix = name[:-len("gate_up_proj")]
            gate_up, down = sd.pop(name), sd.pop(prefix + "down_proj")
            I = gate_up.shape[1] // 2
            for e in range(gate_up.shape[0]):
                sd[f"{prefix}{e}.gate_proj.weight"] = gate_up[e, :I]
                sd[f"{prefix}{e}.up_proj.weight"] = gate_up[e, I:]
                sd[f"{prefix}{e}.down_proj.weight"] = down[e]
        return sd

    def checkpoint_tensors(self, tensors):
        """A checkpoint's tensors with every MoE layer's experts fused
        (mlp.experts.gate_up_proj, mlp.experts.down_proj), from the
        per-expert names where the fused ones are absent."""
        c = self.c
        for i, moe in enumerate(c.moe_layers):
            prefix = f"model.layers.{i}.mlp.experts."
            if not moe or (prefix + "gate_up_proj" in tensors and prefix + "down_proj" in tensors):
                continue
            gate_up, down = [], []
            for e in range(c.num_experts):
                names = [f"{prefix}{e}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
                for n in names:
                    if n not in tensors:
                        raise KeyError(f"{n} missing from model.safetensors (nor "
                                       f"{prefix}gate_up_proj and {prefix}down_proj)")
                gate_up.append(np.concatenate([tensors[names[0]], tensors[names[1]]], axis=0))
                down.append(tensors[names[2]])
            tensors[prefix + "gate_up_proj"] = np.stack(gate_up)
            tensors[prefix + "down_proj"] = np.stack(down)
        return tensors


class ModelType:
    """One model type of the reference: how its config's own fields are
    read, its layer's mixer (written from the type's upstream source) and
    its language model. linattn's table (core/model/model_types.h) names
    each type's mixer here as its reference; tests compare the two."""

    def __init__(self, read_config, mixer, lm, num_heads):
        self.read_config, self.mixer, self.lm = read_config, mixer, lm
        self.num_heads = num_heads  # the config class's default


# The model types, one line each.
MODEL_TYPES = {
    "linear_attn": ModelType(Config._linear_attn, LinearAttention, LinearAttentionLM, 4),
    "retnet": ModelType(Config._retnet, MultiScaleRetention, LinearAttentionLM, 8),
    "gla": ModelType(Config._gla, GatedLinearAttention, LinearAttentionLM, 4),
    "delta_net": ModelType(Config._delta_net, DeltaNet, LinearAttentionLM, 16),
    "gated_deltanet": ModelType(Config._gated_deltanet, GatedDeltaNet, LinearAttentionLM, 6),
    "mamba2": ModelType(Config._mamba2, Mamba2Mixer, Mamba2LM, None),
    "rwkv7": ModelType(Config._rwkv7, RWKV7Attention, RWKV7LM, None),
    "rwkv6": ModelType(Config._rwkv6, RWKV6Attention, RWKV6LM, 4),
    "granitemoehybrid": ModelType(Config._granitemoehybrid, GraniteMoeHybridMambaLayer, GraniteMoeHybridLM, 32),
    "qwen3_next": ModelType(Config._qwen3_next, Qwen3NextGatedDeltaNet, Qwen3NextLM, 16),
}


def new_model(c):
    return MODEL_TYPES[c.model_type].lm(c)


def load_model(model_dir, dtype=torch.float32):
    c = load_config(model_dir)
    model = new_model(c)
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    # A type whose checkpoints name some tensors otherwise than its modules
    # (qwen3_next's per-expert names) maps them first.
    if hasattr(model, "checkpoint_tensors"):
        tensors = model.checkpoint_tensors(tensors)
    sd = model.state_dict()
    # Checkpoints written before fla's GatedMLP split (February 2025) hold one
    # mlp.gate_proj of 2I rows, the gate's I rows first, and no up_proj.
    for name in [n for n in tensors if n.endswith(".mlp.gate_proj.weight")]:
        up = name.replace(".gate_proj.", ".up_proj.")
        if up not in tensors and tensors[name].shape[0] == 2 * c.intermediate_size:
            fused = tensors.pop(name)
            tensors[name] = fused[:c.intermediate_size]
            tensors[up] = fused[c.intermediate_size:]
    for name in list(sd):
        src = name
        if name not in tensors and getattr(c, "tie_feature_map_qk", False) and \
                ".feature_map_k." in name:
            src = name.replace(".feature_map_k.", ".feature_map_q.")
        # Tied, the embeddings win over a stored lm_head (transformers ties
        # after loading).
        if c.tie_word_embeddings and name == "lm_head.weight":
            src = model.embeddings_name
        # mamba_ssm's checkpoints name the embeddings backbone.embedding.
        if src not in tensors and src == "backbone.embeddings.weight":
            src = "backbone.embedding.weight"
        if src not in tensors:
            raise KeyError(f"{name} missing from model.safetensors")
        sd[name] = torch.from_numpy(tensors[src].copy())
    model.load_state_dict(sd)
    return model.to(dtype).eval()


def random_model(config, seed):
    torch.manual_seed(seed)
    c = Config(config)
    model = new_model(c)
    # qwen3_next's zero-centred norms scale by 1 + weight: weights near 0.
    zero_centred = {f"{n}.weight" for n, m in model.named_modules()
                    if getattr(m, "zero_centred", False)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in zero_centred:
                p.normal_(0, 0.1)
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(".A_log"):
                # fla's init: A ~ U(0, 16), kept away from 0 here.
                p.copy_(torch.empty_like(p).uniform_(0.5, 16).log())
            elif name.endswith(".dt_bias"):
                # fla's init: the softplus inverse of dt ~ logU(1e-3, 0.1).
                dt = torch.exp(torch.rand_like(p) * (math.log(0.1) - math.log(1e-3)) +
                               math.log(1e-3))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith("conv1d.weight"):
                p.normal_(0, 1 / math.sqrt(p.shape[-1]))
            elif name.endswith("mixer.D") or name.endswith("mamba.D"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif re.search(r"\.(attn|ffn)\.x_[rwkvag]$", name) or name.endswith(".mu"):
                # rwkv7's and rwkv6's token-shift mixes: fractions of the
                # previous token.
                p.uniform_(0, 1)
            elif name.endswith(".attn.k_a"):
                p.copy_(1 + 0.1 * torch.randn_like(p))  # fla's init: 1.02
            elif name.endswith(".attn.k_k"):
                p.copy_(0.7 + 0.1 * torch.randn_like(p))  # fla's: 0.71 - linear / 10
            elif p.dim() == 2:
                # granitemoehybrid's and qwen3_next's routers too (and
                # qwen3_next's shared_expert_gate): logits of order 1, so
                # that the top-k experts change from token to token.
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
            elif p.dim() == 3:
                # granitemoehybrid's and qwen3_next's experts, (num_experts,
                # out, in).
                p.normal_(0, 1 / math.sqrt(p.shape[2]))
            else:
                p.normal_(0, 0.1)
    return model


def save_model(model, out_dir, dtype="F32", experts=None):
    """config.json and model.safetensors (F32, F16 or BF16); experts: for
    qwen3_next, "split" (the Hub's per-expert names, the default) or "fused"
    (transformers v5's 3-D tensors)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.c.raw, f, indent=2, sort_keys=True)
        f.write("\n")
    if experts is None:
        sd = model.state_dict_for_export()
    elif isinstance(model, Qwen3NextLM):
        sd = model.state_dict_for_export(experts=experts)
    else:
        raise ValueError("an experts layout is for qwen3_next models only")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), sd, dtype)


# ---------------------------------------------------------------- commands


def cmd_logits(args):
    dtype = getattr(torch, args.dtype)
    model = load_model(args.model, dtype)
    tokens = torch.tensor([[int(t) for t in args.tokens.split(",")]])
    with torch.no_grad():
        logits = model(tokens)[0]
    out = logits if args.all else logits[-1:]
    np.save(args.out, out.numpy().astype(np.float64))


def random_config(args):
    """The config.json of `random`: the fields every type shares, then the
    type's own from the command line."""
    config = {"model_type": args.model_type, "hidden_size": args.hidden_size,
              "num_hidden_layers": args.layers, "vocab_size": args.vocab_size,
              "tie_word_embeddings": args.tie_word_embeddings,
              "bos_token_id": None, "eos_token_id": None,
              # random models are byte-level: ids 0..255 are UTF-8 bytes
              "linattn_tokenizer": "bytes"}
    if args.model_type == "rwkv7":
        config.update({
            "head_dim": args.head_dim, "hidden_act": "sqrelu", "norm_eps": 1e-5,
            "intermediate_size": args.intermediate_size, "hidden_ratio": 4,
            "decay_low_rank_dim": args.low_rank_dim, "a_low_rank_dim": args.low_rank_dim,
            "v_low_rank_dim": args.low_rank_dim, "gate_low_rank_dim": 2 * args.low_rank_dim,
            "norm_first": True, "norm_bias": True, "fuse_norm": True, "attn_mode": "chunk"})
        return config
    if args.model_type == "rwkv6":
        config.update({
            "num_heads": args.num_heads, "expand_k": args.expand_k, "expand_v": args.expand_v,
            "hidden_act": "sqrelu", "norm_eps": 1e-5,
            "intermediate_size": args.intermediate_size, "hidden_ratio": 3.5,
            "proj_low_rank_dim": args.low_rank_dim, "gate_low_rank_dim": 2 * args.low_rank_dim,
            "norm_first": True, "norm_bias": True, "fuse_norm": True, "attn_mode": "chunk"})
        return config
    if args.model_type == "granitemoehybrid":
        return granitemoehybrid_config(args, config)
    if args.model_type == "qwen3_next":
        return qwen3_next_config(args, config)
    if args.model_type == "mamba2":
        config.update({
            "head_dim": args.head_dim, "expand": 2, "state_size": args.state_size,
            "n_groups": args.n_groups, "conv_kernel": args.conv_size, "use_conv_bias": True,
            "use_bias": False, "rmsnorm": not args.no_rmsnorm,
            "norm_before_gate": args.norm_before_gate, "D_has_hdim": args.d_has_hdim,
            "dt_limit": [0.0, float("inf")], "hidden_act": "silu", "norm_eps": 1e-5,
            "residual_in_fp32": True})
        return config
    config.update({"num_heads": args.num_heads, "hidden_act": "swish",
                   "hidden_ratio": 2 if args.model_type == "retnet" else 4,
                   "intermediate_size": args.intermediate_size, "norm_eps": 1e-6,
                   "attn_mode": "chunk"})
    if args.model_type in ("linear_attn", "retnet", "gla"):
        config.update({"num_kv_heads": args.num_kv_heads, "expand_k": args.expand_k,
                       "expand_v": args.expand_v, "elementwise_affine": not args.no_affine})
    if args.model_type in ("retnet", "gla"):
        config.update({"use_output_gate": not args.no_gate, "fuse_norm": True})
    if args.model_type in ("gla", "delta_net", "gated_deltanet"):
        config["conv_size"] = args.conv_size
    if args.model_type in ("delta_net", "gated_deltanet"):
        config.update({"use_short_conv": not args.no_short_conv,
                       "allow_neg_eigval": args.allow_neg_eigval})
    if args.model_type == "linear_attn":
        config.update({"feature_map": args.feature_map,
                       "tie_feature_map_qk": args.tie_feature_map_qk, "norm_q": args.norm_q,
                       "norm_k": args.norm_k, "norm_feature_map": args.normalized})
    elif args.model_type == "retnet":
        config["feature_map"] = args.retnet_feature_map
    elif args.model_type == "gla":
        config.update({"feature_map": args.gla_feature_map, "use_short_conv": args.short_conv,
                       "clamp_min": args.clamp_min})
    elif args.model_type == "delta_net":
        config.update({"expand_k": args.expand_k, "expand_v": args.expand_v,
                       "use_gate": args.use_gate, "use_beta": not args.no_beta,
                       "qk_activation": args.qk_activation, "qk_norm": args.qk_norm})
    else:  # gated_deltanet
        config.update({"num_v_heads": args.num_v_heads, "head_dim": args.head_dim,
                       "expand_v": args.expand_v, "use_gate": not args.no_gate})
    return config


def granitemoehybrid_config(args, config):
    """transformers' GraniteMoeHybridConfig fields for `random`: multipliers
    of the size Granite's configs use (embedding 12, residual 0.22, logits
    divided by a few, attention 1/head_dim, muP's in place of head_dim^-1/2)."""
    h, layers = args.hidden_size, args.layers
    types = (args.layer_types.split(",") if args.layer_types
             else ["mamba"] * (layers - 1) + ["attention"])
    if len(types) != layers:
        raise SystemExit(f"--layer-types names {len(types)} layers, --layers is {layers}")
    heads = args.num_heads
    kv = args.num_kv_heads or heads
    head_dim = h // heads
    intermediate = int(args.mamba_expand * h)
    mamba_heads = args.mamba_heads or intermediate // args.head_dim
    attention_multiplier = args.attention_multiplier
    if attention_multiplier is None:
        attention_multiplier = 1.0 / head_dim
    config.update({
        "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
        "intermediate_size": args.intermediate_size or 32,
        "num_local_experts": args.num_experts, "num_experts_per_tok": args.experts_per_token,
        "shared_intermediate_size": args.shared_intermediate_size,
        "position_embedding_type": "nope" if args.nope else "rope",
        "rope_theta": args.rope_theta, "rope_scaling": None,
        "attention_bias": args.attention_bias, "attention_dropout": 0.0,
        "embedding_multiplier": args.embedding_multiplier,
        "residual_multiplier": args.residual_multiplier,
        "attention_multiplier": attention_multiplier,
        "logits_scaling": args.logits_scaling,
        "layer_types": types,
        "mamba_n_heads": mamba_heads, "mamba_d_head": intermediate // mamba_heads,
        "mamba_n_groups": args.n_groups, "mamba_d_state": args.state_size,
        "mamba_d_conv": args.conv_size, "mamba_expand": args.mamba_expand,
        "mamba_chunk_size": 256, "mamba_conv_bias": not args.no_mamba_conv_bias,
        "mamba_proj_bias": args.mamba_proj_bias})
    return config


def qwen3_next_config(args, config):
    """transformers' Qwen3NextConfig fields for `random`: attention heads of
    --head-dim (head_dim is its own field), Gated DeltaNet heads of
    --linear-head-dim (default --head-dim), --linear-key-heads q/k heads and
    --num-v-heads value heads (default twice as many), MoE layers of
    --num-experts (0: every layer dense) beside dense ones of
    --intermediate-size (96 when not given)."""
    layers = args.layers
    heads = args.num_heads
    kv = args.num_kv_heads or heads
    lk = args.linear_key_heads
    lhd = args.linear_head_dim or args.head_dim
    config.update({
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": args.head_dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "rope_theta": args.rope_theta, "partial_rotary_factor": args.partial_rotary_factor,
        "attention_bias": args.attention_bias, "attention_dropout": 0.0,
        "intermediate_size": args.intermediate_size or 96,
        "linear_conv_kernel_dim": args.conv_size, "linear_key_head_dim": lhd,
        "linear_value_head_dim": lhd, "linear_num_key_heads": lk,
        "linear_num_value_heads": args.num_v_heads or 2 * lk,
        "num_experts": args.num_experts, "num_experts_per_tok": args.experts_per_token,
        "moe_intermediate_size": args.moe_intermediate_size,
        "shared_expert_intermediate_size": args.shared_intermediate_size,
        "norm_topk_prob": not args.no_norm_topk_prob,
        "decoder_sparse_step": args.decoder_sparse_step,
        "mlp_only_layers": ([int(i) for i in args.mlp_only_layers.split(",")]
                            if args.mlp_only_layers else [])})
    if args.full_attention_interval is not None:
        if args.layer_types:
            raise SystemExit("--layer-types and --full-attention-interval exclude each other")
        config["full_attention_interval"] = args.full_attention_interval
    else:
        types = (args.layer_types.split(",") if args.layer_types
                 else ["linear_attention"] * (layers - 1) + ["full_attention"])
        if len(types) != layers:
            raise SystemExit(f"--layer-types names {len(types)} layers, --layers is {layers}")
        config["layer_types"] = types
    return config


def cmd_random(args):
    config = random_config(args)
    if args.attn is not None:
        config["attn"] = json.loads(args.attn)
    if args.fused_experts and args.model_type != "qwen3_next":
        raise SystemExit("--fused-experts is for qwen3_next")
    save_model(random_model(config, args.seed), args.out, args.dtype,
               experts="fused" if args.fused_experts else None)


def cmd_generate(args):
    model = load_model(args.model)
    tokens = list(args.prompt.encode())
    states = model.new_state(1)
    with torch.no_grad():
        for t in tokens:
            logits, states = model.step(torch.tensor([t]), states)
        out = []
        for _ in range(args.max_tokens):
            t = int(logits[0].argmax())
            out.append(t)
            logits, states = model.step(torch.tensor([t]), states)
    sys.stdout.write(bytes(b for b in out if b < 256).decode("utf-8", "replace") + "\n")


def cmd_bench(args):
    """Times this reference: full-recompute decode (what fla's own model does,
    its layer keeps no cache) and recurrent-state decode, batch 1."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    c = model.c
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, c.vocab_size, (1, args.prompt_tokens), generator=g)
    result = {"threads": args.threads, "prompt_tokens": args.prompt_tokens}
    with torch.no_grad():
        t0 = time.perf_counter()
        model(prompt)
        result["prefill_s"] = time.perf_counter() - t0
        # Recurrent decode: the state kept per sequence, as linattn does.
        states = model.new_state(1)
        tok = torch.tensor([1])
        for _ in range(3):
            model.step(tok, states)
        t0 = time.perf_counter()
        for _ in range(args.decode_tokens):
            logits, states = model.step(tok, states)
        result["recurrent_decode_tokens_per_s"] = args.decode_tokens / (time.perf_counter() - t0)
        for batch in args.batches:
            bstates = model.new_state(batch)
            btok = torch.ones(batch, dtype=torch.long)
            model.step(btok, bstates)
            t0 = time.perf_counter()
            for _ in range(args.decode_tokens):
                logits, bstates = model.step(btok, bstates)
            result[f"recurrent_decode_aggregate_tokens_per_s_b{batch}"] = (
                batch * args.decode_tokens / (time.perf_counter() - t0))
        # Full recompute at the prompt's length: one generated token costs a
        # forward over the whole context (0: not measured).
        if args.recompute_tokens > 0:
            t0 = time.perf_counter()
            for _ in range(args.recompute_tokens):
                model(prompt)
            result["recompute_decode_tokens_per_s"] = (
                args.recompute_tokens / (time.perf_counter() - t0))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logits", help="next-token logits of a token sequence (.npy, float64)")
    a.add_argument("--model", required=True)
    a.add_argument("--tokens", required=True, help="comma-separated token ids")
    a.add_argument("--out", required=True)
    a.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    a.add_argument("--all", action="store_true", help="logits of every position, not only the last")
    a.set_defaults(fn=cmd_logits)
    r = sub.add_parser("random", help="write a random fla-layout model")
    r.add_argument("--out", required=True)
    r.add_argument("--model-type", default="linear_attn",
                   choices=["linear_attn", "retnet", "gla", "delta_net", "gated_deltanet",
                            "mamba2", "rwkv7", "rwkv6", "granitemoehybrid", "qwen3_next"])
    r.add_argument("--feature-map", default="elu", choices=FEATURE_MAPS)
    r.add_argument("--normalized", action="store_true", help="norm_feature_map = true")
    r.add_argument("--hidden-size", type=int, default=64)
    r.add_argument("--layers", type=int, default=2)
    r.add_argument("--num-heads", type=int, default=4,
                   help="granitemoehybrid, qwen3_next: num_attention_heads")
    r.add_argument("--num-kv-heads", type=int, default=None,
                   help="granitemoehybrid, qwen3_next: num_key_value_heads")
    r.add_argument("--expand-k", type=float, default=1)
    r.add_argument("--expand-v", type=float, default=1)
    r.add_argument("--intermediate-size", type=int, default=None,
                   help="granitemoehybrid: each expert's (32 when not given); qwen3_next: "
                   "the dense MLP's (96 when not given)")
    r.add_argument("--vocab-size", type=int, default=300)
    r.add_argument("--tie-feature-map-qk", action="store_true")
    r.add_argument("--tie-word-embeddings", action="store_true")
    r.add_argument("--norm-q", action="store_true")
    r.add_argument("--norm-k", action="store_true")
    r.add_argument("--no-affine", action="store_true", help="elementwise_affine = false")
    r.add_argument("--state-size", type=int, default=16,
                   help="mamba2; granitemoehybrid: mamba_d_state")
    r.add_argument("--n-groups", type=int, default=1,
                   help="mamba2; granitemoehybrid: mamba_n_groups")
    r.add_argument("--no-rmsnorm", action="store_true", help="mamba2: rmsnorm = false")
    r.add_argument("--norm-before-gate", action="store_true", help="mamba2")
    r.add_argument("--d-has-hdim", action="store_true", help="mamba2: D_has_hdim = true")
    r.add_argument("--retnet-feature-map", default=None,
                   choices=[m for m in RETNET_FEATURE_MAPS if m is not None], help="retnet")
    r.add_argument("--gla-feature-map", default=None,
                   choices=[m for m in GLA_FEATURE_MAPS if m is not None], help="gla")
    r.add_argument("--short-conv", action="store_true", help="gla: use_short_conv = true")
    r.add_argument("--clamp-min", type=float, default=None, help="gla")
    r.add_argument("--use-gate", action="store_true", help="delta_net: use_gate = true")
    r.add_argument("--no-beta", action="store_true", help="delta_net: use_beta = false")
    r.add_argument("--qk-activation", default="silu", choices=["silu", "relu", "elu", "identity"],
                   help="delta_net")
    r.add_argument("--qk-norm", default="l2", choices=["l2", "sum"], help="delta_net")
    r.add_argument("--head-dim", type=int, default=16,
                   help="gated_deltanet, mamba2, rwkv7; granitemoehybrid: mamba_d_head (unless "
                   "--mamba-heads); qwen3_next: the attention's head_dim")
    r.add_argument("--low-rank-dim", type=int, default=16,
                   help="rwkv7: the decay, a and v LoRAs' rank (the gate's twice it); "
                   "rwkv6: proj_low_rank_dim (gate_low_rank_dim twice it)")
    r.add_argument("--num-v-heads", type=int, default=None,
                   help="gated_deltanet; qwen3_next: linear_num_value_heads (default twice "
                   "--linear-key-heads)")
    r.add_argument("--conv-size", type=int, default=4,
                   help="gla, delta_net, gated_deltanet, mamba2 (conv_kernel), "
                   "granitemoehybrid (mamba_d_conv), qwen3_next (linear_conv_kernel_dim)")
    r.add_argument("--no-gate", action="store_true",
                   help="gated_deltanet: use_gate = false; retnet, gla: use_output_gate = false")
    r.add_argument("--no-short-conv", action="store_true",
                   help="delta_net, gated_deltanet: use_short_conv = false")
    r.add_argument("--allow-neg-eigval", action="store_true", help="delta_net, gated_deltanet")
    r.add_argument("--attn", default=None, metavar="JSON",
                   help="fla's hybrid attention config (a spec or a list of them), e.g. "
                   "'{\"layers\": [1], \"num_heads\": 4, \"window_size\": 64}'")
    gr = r.add_argument_group("granitemoehybrid (and qwen3_next where named)")
    gr.add_argument("--layer-types", default=None,
                    help="comma-separated mamba/attention, one per layer (default: Mamba "
                    "layers, the last attention); qwen3_next: linear_attention/full_attention")
    gr.add_argument("--num-experts", type=int, default=4,
                    help="num_local_experts (0: dense, the shared MLP only); qwen3_next: "
                    "num_experts (0: every layer a dense MLP)")
    gr.add_argument("--experts-per-token", type=int, default=2,
                    help="num_experts_per_tok (qwen3_next too)")
    gr.add_argument("--shared-intermediate-size", type=int, default=48,
                    help="the shared MLP's (0: none); qwen3_next: "
                    "shared_expert_intermediate_size")
    gr.add_argument("--nope", action="store_true",
                    help="position_embedding_type nope (no rotary; default rope)")
    gr.add_argument("--rope-theta", type=float, default=10000.0, help="qwen3_next too")
    gr.add_argument("--embedding-multiplier", type=float, default=12.0)
    gr.add_argument("--residual-multiplier", type=float, default=0.22)
    gr.add_argument("--attention-multiplier", type=float, default=None,
                    help="the attention's scale (default 1/head_dim)")
    gr.add_argument("--logits-scaling", type=float, default=6.0, help="logits divided by it")
    gr.add_argument("--mamba-heads", type=int, default=None,
                    help="mamba_n_heads (default mamba_expand * hidden_size / --head-dim)")
    gr.add_argument("--mamba-expand", type=int, default=2)
    gr.add_argument("--attention-bias", action="store_true", help="qwen3_next too")
    gr.add_argument("--mamba-proj-bias", action="store_true")
    gr.add_argument("--no-mamba-conv-bias", action="store_true")
    qn = r.add_argument_group("qwen3_next")
    qn.add_argument("--linear-key-heads", type=int, default=2, help="linear_num_key_heads")
    qn.add_argument("--linear-head-dim", type=int, default=None,
                    help="linear_key_head_dim and linear_value_head_dim (default --head-dim)")
    qn.add_argument("--partial-rotary-factor", type=float, default=0.25)
    qn.add_argument("--moe-intermediate-size", type=int, default=32)
    qn.add_argument("--decoder-sparse-step", type=int, default=1)
    qn.add_argument("--mlp-only-layers", default=None,
                    help="comma-separated layer indices with a dense MLP")
    qn.add_argument("--no-norm-topk-prob", action="store_true", help="norm_topk_prob = false")
    qn.add_argument("--full-attention-interval", type=int, default=None,
                    help="no layer_types: every N-th layer full attention")
    qn.add_argument("--fused-experts", action="store_true",
                    help="write mlp.experts.gate_up_proj/down_proj (transformers v5) in place "
                    "of the Hub's per-expert names")
    r.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(fn=cmd_random)
    g = sub.add_parser("generate", help="greedy continuation of a byte-level model")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=64)
    g.set_defaults(fn=cmd_generate)
    b = sub.add_parser("bench", help="time the reference's prefill and decode (JSON)")
    b.add_argument("--model", required=True)
    b.add_argument("--prompt-tokens", type=int, default=1024)
    b.add_argument("--decode-tokens", type=int, default=64)
    b.add_argument("--recompute-tokens", type=int, default=3,
                   help="full forwards timed as recompute decode (0: none)")
    b.add_argument("--batches", type=int, nargs="*", default=[])
    b.add_argument("--threads", type=int, default=2)
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
