#!/usr/bin/python3
"""Writes the model fixtures the C++ model tests compare against.

For every case: a random fla-layout model directory (config.json and
model.safetensors, written by tools/linattn_ref.py), a token sequence and the
reference logits after every token, computed by linattn_ref.py's PyTorch
forward in float64:

    OUT/<case>/config.json, model.safetensors
    OUT/<case>/tokens.txt            ids, space-separated
    OUT/<case>/logits.f64            (tokens × vocab) little-endian float64

Cases cover every supported feature map, normalised and not, with and without
num_kv_heads < num_heads, tied feature maps, norm_q/norm_k, no affine head
norm, tied embeddings, F16/BF16 files and expand_k/expand_v ≠ 1; every rule
type's options; fla's hybrids (softmax-attention layers); transformers'
granitemoehybrid (Mamba-2 and attention layers, dense or MoE) and qwen3_next
(Gated DeltaNet and gated attention layers, dense or MoE with a shared
expert, partial rotary, the per-expert and the fused expert names). With
--builtin DIR the built-in model gets the same treatment (case "builtin"), and
with --builtin-rwkv7 DIR the RWKV-7 model shipped beside it (case
"builtin_rwkv7").
A SentencePiece model trained on a small text goes to OUT/spm/ with the ids
python3-sentencepiece gives for a few strings (spm/expected.json).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, HERE)
import linattn_ref  # noqa: E402  (sets up OpenBLAS before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402


def cases():
    out = []
    for fm in linattn_ref.FEATURE_MAPS:
        for normalized in (False, True):
            for kv in (None, 2):
                name = f"{fm}_{'norm' if normalized else 'unnorm'}_{'gqa' if kv else 'mha'}"
                out.append((name, dict(feature_map=fm, norm_feature_map=normalized,
                                       num_kv_heads=kv)))
    for fm in ("t2r", "hedgehog", "elementwise_product"):
        out.append((f"{fm}_tied", dict(feature_map=fm, tie_feature_map_qk=True,
                                       norm_feature_map=True)))
    out.append(("elu_normqk", dict(feature_map="elu", norm_q=True, norm_k=True,
                                   norm_feature_map=True)))
    out.append(("relu_noaffine_tiedemb", dict(feature_map="relu", elementwise_affine=False,
                                              tie_word_embeddings=True)))
    out.append(("elu_expand", dict(feature_map="elu", expand_k=0.5, expand_v=2,
                                   norm_feature_map=True)))
    out.append(("hedgehog_bf16", dict(feature_map="hedgehog", norm_feature_map=True,
                                      _dtype="BF16")))
    out.append(("elu_f16", dict(feature_map="elu", norm_feature_map=True, _dtype="F16")))
    return out


# The gated and delta-rule types: each option the loader accepts at least
# once, and the combinations whose code paths meet (GQA/GVA with gates and
# convolutions, groups with the gated norm's placement).
SHARED = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 300,
          "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257,
          "linattn_tokenizer": "bytes"}
RULE_TYPES = {
    "retnet": {"num_heads": 4, "hidden_act": "swish", "hidden_ratio": 2, "norm_eps": 1e-6,
               "expand_k": 1, "expand_v": 2},
    "gla": {"num_heads": 4, "hidden_act": "swish", "hidden_ratio": 4, "norm_eps": 1e-6,
            "expand_k": 0.5, "expand_v": 1},
    "delta_net": {"num_heads": 4, "hidden_act": "swish", "hidden_ratio": 4, "norm_eps": 1e-6},
    "gated_deltanet": {"num_heads": 4, "head_dim": 16, "expand_v": 2, "hidden_act": "swish",
                       "hidden_ratio": 4, "norm_eps": 1e-6},
    "mamba2": {"head_dim": 16, "expand": 2, "state_size": 16, "n_groups": 1, "conv_kernel": 4,
               "hidden_act": "silu", "norm_eps": 1e-5, "dt_limit": [0.0, float("inf")]},
    "rwkv7": {"head_dim": 16, "hidden_act": "sqrelu", "norm_eps": 1e-5, "hidden_ratio": 4,
              "decay_low_rank_dim": 8, "a_low_rank_dim": 8, "v_low_rank_dim": 4,
              "gate_low_rank_dim": 16, "attn_mode": "chunk"},
    "rwkv6": {"num_heads": 4, "expand_k": 0.5, "expand_v": 1, "hidden_act": "sqrelu",
              "norm_eps": 1e-5, "hidden_ratio": 3.5, "proj_low_rank_dim": 8,
              "gate_low_rank_dim": 16, "attn_mode": "chunk"},
}
# Fields whose null means something else than their absence (RWKV7Attention's
# own low-rank sizes).
KEEP_NULL = ("feature_map", "bos_token_id", "decay_low_rank_dim", "a_low_rank_dim",
             "v_low_rank_dim", "gate_low_rank_dim")


def rule_cases():
    out = []
    for fm in (None, "relu", "sigmoid", "silu", "gelu"):
        out.append((f"retnet_{fm or 'plain'}", "retnet", dict(feature_map=fm)))
    out.append(("retnet_gqa_nogate", "retnet", dict(num_kv_heads=2, use_output_gate=False)))
    out.append(("retnet_unfused_noaffine", "retnet",
                dict(fuse_norm=False, elementwise_affine=False, expand_k=0.5, expand_v=1)))
    out.append(("retnet_bf16_tied", "retnet", dict(tie_word_embeddings=True, _dtype="BF16")))
    for fm in (None, "relu", "sigmoid", "logsigmoid", "silu", "sqrelu"):
        out.append((f"gla_{fm or 'plain'}", "gla", dict(feature_map=fm)))
    out.append(("gla_conv_gqa", "gla", dict(use_short_conv=True, conv_size=4, num_kv_heads=2)))
    out.append(("gla_conv2_clamp", "gla", dict(use_short_conv=True, conv_size=2,
                                               clamp_min=-0.035)))
    out.append(("gla_nogate_unfused", "gla", dict(use_output_gate=False, fuse_norm=False,
                                                  expand_k=1)))
    for act in ("silu", "relu", "elu", "identity"):
        out.append((f"delta_net_{act}_l2", "delta_net", dict(qk_activation=act)))
    out.append(("delta_net_elu_sum", "delta_net", dict(qk_activation="elu", qk_norm="sum")))
    out.append(("delta_net_noconv_gate", "delta_net", dict(use_short_conv=False, use_gate=True)))
    out.append(("delta_net_nobeta_expand", "delta_net", dict(use_beta=False, expand_v=2,
                                                            conv_size=3)))
    out.append(("delta_net_negeig", "delta_net", dict(allow_neg_eigval=True)))
    out.append(("gated_deltanet_plain", "gated_deltanet", {}))
    out.append(("gated_deltanet_gva", "gated_deltanet", dict(num_v_heads=8, expand_v=1)))
    out.append(("gated_deltanet_nogate_noconv", "gated_deltanet",
                dict(use_gate=False, use_short_conv=False, allow_neg_eigval=True)))
    out.append(("gated_deltanet_f16", "gated_deltanet", dict(_dtype="F16", conv_size=2)))
    out.append(("mamba2_plain", "mamba2", {}))
    out.append(("mamba2_groups", "mamba2", dict(n_groups=2)))
    out.append(("mamba2_groups_before_gate", "mamba2", dict(n_groups=4, norm_before_gate=True,
                                                          D_has_hdim=True)))
    out.append(("mamba2_nonorm_bias", "mamba2", dict(rmsnorm=False, use_bias=True,
                                                    use_conv_bias=False, conv_kernel=2)))
    out.append(("mamba2_limits_old_names", "mamba2",
                dict(dt_limit=None, time_step_limit=[0.01, 0.2], norm_eps=None,
                     layer_norm_epsilon=1e-4, tie_word_embeddings=True)))
    out.append(("rwkv7_plain", "rwkv7", {}))
    out.append(("rwkv7_unfused_nobias", "rwkv7", dict(fuse_norm=False, norm_bias=False,
                                                     num_hidden_layers=3)))
    out.append(("rwkv7_value_dim_no_prenorm", "rwkv7",
                dict(value_dim=[128, 128], norm_first=False, head_dim=32,
                     intermediate_size=96)))
    out.append(("rwkv7_default_ranks_tied", "rwkv7",
                dict(decay_low_rank_dim=None, a_low_rank_dim=None, v_low_rank_dim=None,
                     gate_low_rank_dim=None, tie_word_embeddings=True, hidden_ratio=3.5)))
    out.append(("rwkv7_bf16", "rwkv7", dict(_dtype="BF16", head_dim=8)))
    out.append(("rwkv6_plain", "rwkv6", {}))
    out.append(("rwkv6_unfused_nobias", "rwkv6", dict(fuse_norm=False, norm_bias=False,
                                                     num_hidden_layers=3,
                                                     linattn_group_norm_eps=6.4e-4)))
    out.append(("rwkv6_expand_no_prenorm", "rwkv6",
                dict(expand_k=1, expand_v=2, norm_first=False, num_heads=2,
                     intermediate_size=96)))
    out.append(("rwkv6_defaults_tied", "rwkv6",
                dict(hidden_ratio=None, proj_low_rank_dim=None, gate_low_rank_dim=None,
                     tie_word_embeddings=True)))
    out.append(("rwkv6_bf16", "rwkv6", dict(_dtype="BF16", num_heads=8)))
    return out


# fla's hybrids: softmax-attention layers (`attn`) beside each type's mixer
# (rwkv6's in place of its time mix), full and windowed (a window of 5 wraps
# the cache's 64-position ring within the 77 tokens), GQA, qkv biases,
# rope_theta, one spec and a list of specs,
# every layer attention, an F16 file.
LINEAR_ATTN = {"model_type": "linear_attn", "num_heads": 4, "feature_map": "elu",
               "norm_feature_map": True, "hidden_act": "swish", "hidden_ratio": 4,
               "norm_eps": 1e-6}


def hybrid_cases():
    return [
        ("hybrid_linear_attn_full", LINEAR_ATTN, dict(attn={"layers": [1], "num_heads": 4})),
        ("hybrid_gla_window_gqa_bias", RULE_TYPES["gla"] | {"model_type": "gla"},
         dict(attn={"layers": [0], "num_heads": 4, "num_kv_heads": 2, "window_size": 5,
                    "rope_theta": 500.0, "qkv_bias": True})),
        ("hybrid_gated_deltanet_specs", RULE_TYPES["gated_deltanet"] | {"model_type": "gated_deltanet"},
         dict(num_hidden_layers=3,
              attn=[{"layers": [0], "num_heads": 2, "window_size": 70},
                    {"layers": [2], "num_heads": 4, "num_kv_heads": 1}])),
        ("hybrid_retnet_all_attention", RULE_TYPES["retnet"] | {"model_type": "retnet"},
         dict(attn={"layers": [0, 1], "num_heads": 8, "num_kv_heads": 4, "qkv_bias": True})),
        ("hybrid_delta_net_f16", RULE_TYPES["delta_net"] | {"model_type": "delta_net"},
         dict(_dtype="F16", attn={"layers": [1], "num_heads": 2, "window_size": 1})),
        # RWKV6Block with Attention in place of its time mix: on layer 0
        # (after pre_norm), and without LayerNorm biases.
        ("hybrid_rwkv6_first_window", RULE_TYPES["rwkv6"] | {"model_type": "rwkv6"},
         dict(num_hidden_layers=3, attn={"layers": [0], "num_heads": 4, "window_size": 6,
                                          "qkv_bias": True})),
        ("hybrid_rwkv6_nobias_gqa", RULE_TYPES["rwkv6"] | {"model_type": "rwkv6"},
         dict(norm_bias=False, attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1})),
    ]


# transformers' granitemoehybrid (IBM Granite 4.0-H): Mamba-2 and attention
# layers (layer_types, or its alias layers_block_type, or neither: all Mamba),
# dense (the shared MLP alone) or MoE (top-1, top-2) with and without the
# shared MLP, rope and nope, GQA and MQA, mamba_n_groups 2, the bias flags, a
# time_step_limit that clamps, tied embeddings, a BF16 file; Granite's
# multipliers everywhere.
GRANITE = {"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 2,
           "vocab_size": 300, "tie_word_embeddings": False, "bos_token_id": 256,
           "eos_token_id": 257, "linattn_tokenizer": "bytes",
           "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "intermediate_size": 32, "num_local_experts": 4,
           "num_experts_per_tok": 2, "shared_intermediate_size": 48,
           "position_embedding_type": "rope", "rope_theta": 10000.0, "rope_scaling": None,
           "attention_bias": False, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
           "attention_multiplier": 0.0625, "logits_scaling": 6.0,
           "layer_types": ["mamba", "attention"], "mamba_n_heads": 8, "mamba_d_head": 16,
           "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
           "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False}


def granite_cases():
    return [
        ("granitemoehybrid_dense", dict(num_local_experts=0, shared_intermediate_size=96)),
        ("granitemoehybrid_moe_shared_top2_gqa_nope",
         dict(num_hidden_layers=3, layer_types=["attention", "mamba", "attention"],
              num_key_value_heads=2, position_embedding_type="nope")),
        ("granitemoehybrid_moe_noshared_top1",
         dict(num_experts_per_tok=1, shared_intermediate_size=0, num_local_experts=6)),
        ("granitemoehybrid_groups_biases",
         dict(num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "attention"],
              mamba_n_groups=2, attention_bias=True, mamba_proj_bias=True,
              mamba_conv_bias=False, mamba_d_conv=3, time_step_limit=[0.0, 0.05],
              num_key_value_heads=1,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
        ("granitemoehybrid_alias_all_mamba_dense_nope",
         dict(layer_types=None, layers_block_type=["mamba", "mamba"], num_local_experts=0,
              position_embedding_type=None, mamba_d_head="auto", mamba_n_heads=4)),
        ("granitemoehybrid_tied_bf16",
         dict(tie_word_embeddings=True, _dtype="BF16", num_hidden_layers=3,
              layer_types=["mamba", "mamba", "attention"], num_key_value_heads=2,
              position_embedding_type="nope")),
    ]


# transformers' qwen3_next (Qwen3-Next): Gated DeltaNet ("linear_attention")
# and gated softmax attention ("full_attention") layers; MoE with a shared
# expert or dense MLPs; partial rotary.
QWEN3_NEXT = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 3,
              "vocab_size": 300, "tie_word_embeddings": False, "bos_token_id": 256,
              "eos_token_id": 257, "linattn_tokenizer": "bytes",
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "attention_bias": False,
              "attention_dropout": 0.0, "intermediate_size": 96,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16, "linear_num_key_heads": 2,
              "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
              "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "layer_types": ["linear_attention", "full_attention", "linear_attention"]}


def qwen3_next_cases():
    """(name, changes to QWEN3_NEXT); a null drops the field."""
    return [
        # Every layer MoE (top-2, renormalised) with the shared expert; 2 key
        # heads for 4 value heads in the linear layers; GQA; rotary on a
        # quarter of each head.
        ("qwen3_next_moe_gva", {}),
        # Dense MLPs only (num_experts 0), biases on q/k/v/o, one key/value
        # head, rotary over the whole head, lm_head tied to the embeddings.
        ("qwen3_next_dense_bias_mqa_full_rotary_tied",
         dict(num_experts=0, attention_bias=True, num_key_value_heads=1,
              partial_rotary_factor=1.0, tie_word_embeddings=True)),
        # MoE only in layer 1 (decoder_sparse_step 2 makes layers 1 and 3
        # sparse, mlp_only_layers takes 3 back), top-1 without renormalising
        # (the weight is the expert's softmax probability).
        ("qwen3_next_sparse_step_mlp_only_top1_unnormed",
         dict(num_hidden_layers=4,
              layer_types=["full_attention", "linear_attention", "linear_attention",
                           "full_attention"],
              decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False,
              num_experts_per_tok=1)),
        # No layer_types: every full_attention_interval-th layer attention
        # (linear, full, linear, full).
        ("qwen3_next_interval_no_layer_types",
         dict(num_hidden_layers=4, layer_types=None, full_attention_interval=2)),
        # The rotary in rope_parameters only (transformers v5's config.json).
        ("qwen3_next_rope_parameters",
         dict(rope_theta=None, partial_rotary_factor=None,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                               "partial_rotary_factor": 0.5})),
        # head_dim 24 with 4 heads of a 64-wide model (rotary over 6 channels),
        # a 3-tap convolution, as many value heads as key heads, key heads
        # narrower than value heads.
        ("qwen3_next_head_dim24_conv3_equal_heads",
         dict(head_dim=24, linear_conv_kernel_dim=3, linear_num_key_heads=4,
              linear_num_value_heads=4, linear_key_head_dim=8)),
        ("qwen3_next_bf16", dict(_dtype="BF16", num_key_value_heads=4)),
        # transformers v5's names: mlp.experts.gate_up_proj (E, 2I, H) and
        # mlp.experts.down_proj (E, H, I) in place of the per-expert ones.
        ("qwen3_next_fused_experts", dict(_experts="fused", num_experts=6,
                                          num_experts_per_tok=3)),
    ]


def random_case(out, name, config, over, seed, rng, drop_nulls=False):
    """A random model of `config` updated by `over` (its "_dtype" the file's
    type, its "_experts" qwen3_next's expert names: "split" or "fused") in
    OUT/<name>, with 77 tokens from `rng` and their logits."""
    over = dict(over)
    dtype = over.pop("_dtype", "F32")
    experts = over.pop("_experts", None)
    config = {**config, **over}
    if drop_nulls:
        config = {key: value for key, value in config.items()
                  if value is not None or key in KEEP_NULL}
    model = linattn_ref.random_model(config, seed=seed)
    case_dir = os.path.join(out, name)
    linattn_ref.save_model(model, case_dir, dtype, experts)
    # Reload so that F16/BF16 cases use the rounded weights.
    model = linattn_ref.load_model(case_dir)
    tokens = [int(t) for t in rng.integers(0, 300, 77)]
    write_case(case_dir, model, tokens)


def write_case(out_dir, model, tokens):
    with torch.no_grad():
        logits = model.double()(torch.tensor([tokens]))[0].numpy()
    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    logits.astype("<f8").tofile(os.path.join(out_dir, "logits.f64"))


def converted_case(out, name, checkpoint, tokens):
    """A BlinkDL-format checkpoint saved as OUT/<name>.pth, converted by
    tools/convert_rwkv.py into OUT/<name> (declared byte-level) with its
    reference logits: (its directory, the .pth)."""
    import convert_rwkv
    case_dir = os.path.join(out, name)
    pth = os.path.join(out, name + ".pth")
    torch.save(checkpoint, pth)
    convert_rwkv.convert(pth, case_dir)
    with open(os.path.join(case_dir, "config.json")) as f:
        config = json.load(f)
    config["linattn_tokenizer"] = "bytes"
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(config, f)
    write_case(case_dir, linattn_ref.load_model(case_dir), tokens)
    return case_dir, pth


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--builtin", help="the built-in model's directory")
    p.add_argument("--builtin-rwkv7", help="the RWKV-7 model shipped beside it")
    args = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(7)
    for i, (name, over) in enumerate(cases()):
        config = {
            "model_type": "linear_attn", "attn_mode": "chunk", "hidden_size": 64,
            "num_hidden_layers": 2, "num_heads": 4, "num_kv_heads": None, "expand_k": 1,
            "expand_v": 1, "feature_map": "elu", "tie_feature_map_qk": False,
            "norm_q": False, "norm_k": False, "norm_feature_map": False,
            "hidden_act": "swish", "hidden_ratio": 4, "intermediate_size": None,
            "norm_eps": 1e-6, "elementwise_affine": True, "vocab_size": 300,
            "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257,
            "linattn_tokenizer": "bytes",
        }
        random_case(args.out, name, config, over, 100 + i, rng)
    for i, (name, model_type, over) in enumerate(rule_cases()):
        config = {"model_type": model_type, **SHARED, **RULE_TYPES[model_type]}
        random_case(args.out, name, config, over, 500 + i, rng, drop_nulls=True)
    # An RWKV-7 checkpoint in BlinkDL's own names, through tools/convert_rwkv.py.
    import convert_rwkv
    import convert_rwkv_test
    tokens = [int(t) for t in rng.integers(0, 300, 77)]
    case_dir, pth = converted_case(
        args.out, "rwkv7_converted",
        convert_rwkv_test.blinkdl_checkpoint(np.random.default_rng(11), vocab=300, layers=2),
        tokens)
    # And an initial state for it (an RWKV state file, through the converter's
    # --state), with the logits BlinkDL's numpy statement gives from it.
    time_state = convert_rwkv_test.random_time_state(np.random.default_rng(12), 2, 2, 64, 0.5)
    state_pth = os.path.join(args.out, "rwkv7_converted_state.pth")
    torch.save(time_state, state_pth)
    convert_rwkv.convert_state(state_pth, os.path.join(case_dir, "initial_state.safetensors"))
    weights = torch.load(pth, weights_only=True)
    convert_rwkv_test.numpy_logits(weights, tokens, 2, 128, 64, time_state).astype(
        "<f8").tofile(os.path.join(case_dir, "logits_initial_state.f64"))
    # An RWKV-6 checkpoint in BlinkDL's names, through the same converter.
    import rwkv6_reference_test
    tokens = [int(t) for t in np.random.default_rng(14).integers(0, 300, 77)]
    case_dir, pth = converted_case(
        args.out, "rwkv6_converted",
        rwkv6_reference_test.blinkdl_checkpoint(np.random.default_rng(13), vocab=300, layers=2),
        tokens)
    # And an RWKV-6 state file for it (4 heads of 32), with the logits of
    # BlinkDL's RWKV-6 statement from it.
    time_state = convert_rwkv_test.random_time_state(np.random.default_rng(15), 2, 4, 32, 0.5)
    state_pth = os.path.join(args.out, "rwkv6_converted_state.pth")
    torch.save(time_state, state_pth)
    convert_rwkv.convert_state(state_pth, os.path.join(case_dir, "initial_state.safetensors"))
    rwkv6_reference_test.numpy_logits(torch.load(pth, weights_only=True), tokens, 2, 128, 32,
                                      time_state).astype("<f8").tofile(
        os.path.join(case_dir, "logits_initial_state.f64"))
    for i, (name, base, over) in enumerate(hybrid_cases()):
        random_case(args.out, name, {**SHARED, **base}, over, 900 + i, rng)
    for i, (name, over) in enumerate(granite_cases()):
        random_case(args.out, name, GRANITE, over, 1000 + i, rng)
    for i, (name, over) in enumerate(qwen3_next_cases()):
        random_case(args.out, name, QWEN3_NEXT, over, 1100 + i, rng, drop_nulls=True)
    for shipped, name in ((args.builtin, "builtin"), (args.builtin_rwkv7, "builtin_rwkv7")):
        if not shipped:
            continue
        model = linattn_ref.load_model(shipped)
        case_dir = os.path.join(args.out, name)
        os.makedirs(case_dir, exist_ok=True)
        for f in ("config.json", "model.safetensors", "tokenizer.model"):
            src = os.path.abspath(os.path.join(shipped, f))
            dst = os.path.join(case_dir, f)
            if not os.path.exists(dst):
                os.symlink(src, dst)
        text = "In the beginning God created the heaven and the earth. And the earth was"
        write_case(case_dir, model, list(text.encode()))
    make_spm(os.path.join(args.out, "spm"))


def make_spm(out_dir):
    import sentencepiece as spm
    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    words = ["the", "linear", "attention", "state", "session", "token", "stream", "model",
             "prefill", "decode", "server", "batch", "kernel", "memory", "context"]
    rng = np.random.default_rng(3)
    with open(corpus, "w") as f:
        for _ in range(400):
            f.write(" ".join(words[j] for j in rng.integers(0, len(words), 12)) + ".\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out_dir, "tokenizer"), vocab_size=290, hard_vocab_limit=False,
        model_type="unigram", byte_fallback=True, character_coverage=1.0,
        num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "tokenizer.model"))
    texts = ["the linear attention state", "decode a stream of tokens",
             "ünïcödé falls back to bytes ✓"]
    expected = [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))}
                for t in texts]
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump({"pieces": sp.get_piece_size(), "cases": expected}, f, ensure_ascii=False,
                  indent=1)


if __name__ == "__main__":
    main()
