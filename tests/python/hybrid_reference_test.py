#!/usr/bin/python3
"""tools/linattn_ref.py's hybrid attention layers (fla's `attn` config).

The layer is held to a plain restatement of what fla/layers/attn.py computes
through flash_attn, written here query by query: rotary as a rotation of each
pair (x_m, x_{m + d/2}) by the angle position / theta^(2m/d), the key heads
shared by consecutive query heads, the keys a query sees listed one by one
(the last window_size positions up to its own), and the softmax summed
explicitly. In float64 the two differ only by the order of the sums: about
1e-15 of the outputs; the bound 1e-10 catches any wrong term, which shows at
the outputs' own size. Whole sequences, sequences in pieces and token by
token give the same logits for every fla type the reference builds as a
hybrid; the config's checks are fla's (fla/models/hybrid.py).
"""

import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import linattn_ref as ref  # noqa: E402

import torch  # noqa: E402

BOUND = 1e-10


def rotate(x, position, theta):
    """x (d,) at `position`, GPT-NeoX halves: pair m is (x[m], x[m + d/2]),
    turned by position * theta^(-2m/d). fla builds that angle and its cosine
    and sine in float32 (inv_freq = 1 / theta^(2m/d), the position, their
    product, then cos and sin), whatever the model's dtype: so here too, by
    torch's float32 operations on the d/2 angles at once (another float32
    pow or cosine may differ by an ulp, which scores of size ~10 would carry
    to ~1e-6 of the outputs)."""
    d = x.shape[0]
    out = x.clone()
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.tensor(float(position), dtype=torch.float32) * inv
    cos, sin = angles.cos().tolist(), angles.sin().tolist()
    for m in range(d // 2):
        c, s = cos[m], sin[m]
        out[m] = x[m] * c - x[m + d // 2] * s
        out[m + d // 2] = x[m + d // 2] * c + x[m] * s
    return out


def attention_by_hand(layer, x, start=0):
    """fla's Attention on x (1, T, hidden), the first token at `start` of a
    sequence whose earlier tokens are not in x (so start must be 0 unless
    nothing earlier is in the window)."""
    t_len = x.shape[1]
    d, heads, kv_heads = layer.head_dim, layer.num_heads, layer.num_kv_heads
    q = layer.q_proj(x)[0].view(t_len, heads, d)
    k = layer.k_proj(x)[0].view(t_len, kv_heads, d)
    v = layer.v_proj(x)[0].view(t_len, kv_heads, d)
    group = heads // kv_heads
    out = torch.zeros(t_len, heads, d, dtype=x.dtype)
    for i in range(t_len):
        for h in range(heads):
            qi = rotate(q[i, h], start + i, layer.theta)
            first = 0 if layer.window is None else max(0, i - layer.window + 1)
            seen = range(first, i + 1)
            scores = [float(qi @ rotate(k[j, h // group], start + j, layer.theta)) / math.sqrt(d)
                      for j in seen]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for w, j in zip(weights, seen):
                out[i, h] += (w / total) * v[j, h // group]
    return layer.o_proj(out.reshape(1, t_len, heads * d))


def run_mixer(mixer, x, state):
    """A mixer over x (B, T, hidden) from `state`: its run, or (linear_attn's,
    which steps only) token by token."""
    if hasattr(mixer, "run"):
        return mixer.run(x, state)
    outs = []
    for t in range(x.shape[1]):
        o, state = mixer.step(x[:, t], state)
        outs.append(o)
    return torch.stack(outs, 1), state


def config(model_type, attn, layers=3, **extra):
    c = {"model_type": model_type, "hidden_size": 48, "num_hidden_layers": layers,
         "num_heads": 4, "vocab_size": 61, "attn": attn}
    if model_type == "gated_deltanet":
        c.update(head_dim=12, num_heads=2)
    c.update(extra)
    return c


class AttentionLayerTest(unittest.TestCase):
    def check_layer(self, spec, tokens, seed):
        c = ref.Config(config("linear_attn", dict(spec, layers=[0]), layers=1))
        torch.manual_seed(seed)
        layer = ref.SoftmaxAttention(c, c.attn_layers[0]).double()
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0, 0.5)
            x = torch.randn(1, tokens, 48, dtype=torch.float64)
            expected = attention_by_hand(layer, x)
            got = layer(x)
        scale = expected.abs().max().item()
        self.assertGreater(scale, 0.1)
        self.assertLess((got - expected).abs().max().item(), BOUND * scale)

    def test_full_attention(self):
        self.check_layer({"num_heads": 4}, 9, 1)

    def test_grouped_heads_bias_theta_and_window(self):
        self.check_layer({"num_heads": 6, "num_kv_heads": 2, "qkv_bias": True,
                          "rope_theta": 500.0, "window_size": 3}, 11, 2)

    def test_window_of_one_and_window_past_the_sequence(self):
        self.check_layer({"num_heads": 2, "window_size": 1}, 6, 3)
        self.check_layer({"num_heads": 2, "num_kv_heads": 1, "window_size": 40}, 7, 4)

    def test_a_misread_term_is_caught(self):
        # The check must see the window's edge: one key too many fails it.
        original = attention_by_hand

        def one_more(layer, x, start=0):
            window = layer.window
            layer.window = window + 1
            try:
                return original(layer, x, start)
            finally:
                layer.window = window

        c = ref.Config(config("linear_attn", {"layers": [0], "num_heads": 4, "window_size": 3},
                              layers=1))
        torch.manual_seed(5)
        layer = ref.SoftmaxAttention(c, c.attn_layers[0]).double()
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0, 0.5)
            x = torch.randn(1, 8, 48, dtype=torch.float64)
            self.assertGreater((layer(x) - one_more(layer, x)).abs().max().item(), 1e-3)


class HybridModelTest(unittest.TestCase):
    def check_orders(self, cfg, seed, t_len=23, splits=(1, 7, 16)):
        model = ref.random_model(cfg, seed).double()
        torch.manual_seed(seed)
        tokens = torch.randint(0, 61, (2, t_len))
        with torch.no_grad():
            whole = model(tokens)
            scale = whole.abs().max().item()
            # In pieces: run each piece from the state the earlier ones left.
            embeddings, layers, norm = model.parts()
            states = model.new_state(2, torch.float64)
            pieces, at = [], 0
            for end in list(splits) + [t_len]:
                x = embeddings(tokens[:, at:end])
                for i, layer in enumerate(layers):
                    o, states[i] = run_mixer(layer.attn, layer.attn_norm(x), states[i])
                    x = x + o
                    x = x + layer.mlp(layer.mlp_norm(x))
                pieces.append(model.lm_head(norm(x)))
                at = end
            in_pieces = torch.cat(pieces, 1)
            states = model.new_state(2, torch.float64)
            steps = []
            for t in range(t_len):
                logits, states = model.step(tokens[:, t], states)
                steps.append(logits)
            stepped = torch.stack(steps, 1)
        self.assertGreater(scale, 0.1)
        self.assertLess((in_pieces - whole).abs().max().item(), BOUND * scale)
        self.assertLess((stepped - whole).abs().max().item(), BOUND * scale)

    def test_every_type_in_every_order(self):
        for model_type in ref.HYBRID_TYPES:
            if model_type == "rwkv6":
                continue  # its own block: test_rwkv6_in_every_order
            with self.subTest(model_type=model_type):
                attn = [{"layers": [1], "num_heads": 4, "num_kv_heads": 2, "window_size": 4},
                        {"layers": [2], "num_heads": 2, "qkv_bias": True}]
                self.check_orders(config(model_type, attn), seed=11)

    def test_rwkv6_in_every_order(self):
        # RWKV-6's block with attention in place of the time mix in layers
        # 0 and 2 (the channel mix keeps its token shift): whole, in pieces
        # (RWKVLM.run from the state the earlier pieces left) and stepped.
        cfg = config("rwkv6", [{"layers": [0], "num_heads": 4, "window_size": 3},
                               {"layers": [2], "num_heads": 6, "num_kv_heads": 3}],
                     proj_low_rank_dim=8, gate_low_rank_dim=16, expand_k=0.5)
        model = ref.random_model(cfg, 13).double()
        self.assertIsInstance(model.parts()[1][0].attn, ref.SoftmaxAttention)
        self.assertNotIsInstance(model.parts()[1][1].attn, ref.SoftmaxAttention)
        torch.manual_seed(13)
        tokens = torch.randint(0, 61, (2, 19))
        with torch.no_grad():
            whole = model(tokens)
            states, pieces = model.new_state(2, torch.float64), []
            for a, b in ((0, 1), (1, 8), (8, 19)):
                logits, states = model.run(tokens[:, a:b], states)
                pieces.append(logits)
            states, steps = model.new_state(2, torch.float64), []
            for t in range(19):
                logits, states = model.step(tokens[:, t], states)
                steps.append(logits)
        scale = whole.abs().max().item()
        self.assertGreater(scale, 0.1)
        self.assertLess((torch.cat(pieces, 1) - whole).abs().max().item(), BOUND * scale)
        self.assertLess((torch.stack(steps, 1) - whole).abs().max().item(), BOUND * scale)

    def test_window_limits_what_a_token_sees(self):
        # One attention layer alone: the logits at i do not depend on the
        # token at i - w, and do on the token at i - w + 1.
        w = 4
        model = ref.random_model(config("linear_attn", {"layers": [0], "num_heads": 4,
                                                        "window_size": w}, layers=1), 3).double()
        torch.manual_seed(3)
        tokens = torch.randint(0, 61, (1, 12))
        i = 10
        with torch.no_grad():
            base = model(tokens)[0, i]
            far, near = tokens.clone(), tokens.clone()
            far[0, i - w] = (far[0, i - w] + 1) % 61
            near[0, i - w + 1] = (near[0, i - w + 1] + 1) % 61
            self.assertEqual((model(far)[0, i] - base).abs().max().item(), 0.0)
            self.assertGreater((model(near)[0, i] - base).abs().max().item(), 1e-6)


class HybridConfigTest(unittest.TestCase):
    def refused(self, attn, model_type="gla", words=""):
        with self.assertRaises(ValueError) as caught:
            ref.Config(config(model_type, attn))
        self.assertIn(words, str(caught.exception))

    def test_fla_refuses_these(self):
        self.refused({"num_heads": 4}, words="'layers' is required")
        self.refused({"layers": [0]}, words="'num_heads' is required")
        self.refused({"layers": 1, "num_heads": 4}, words="list or tuple")
        self.refused({"layers": [3], "num_heads": 4}, words="out-of-range layer 3")
        self.refused({"layers": [-1], "num_heads": 4}, words="out-of-range")
        self.refused({"layers": [True], "num_heads": 4}, words="integer layer indices")
        self.refused({"layers": [1, 1], "num_heads": 4}, words="layer 1")
        self.refused([{"layers": [1], "num_heads": 4}, {"layers": [1], "num_heads": 2}],
                     words="index 1")
        self.refused({"layers": [0], "num_heads": 0}, words="num_heads")
        self.refused({"layers": [0], "num_heads": 4, "num_kv_heads": 2.0}, words="num_kv_heads")
        self.refused({"layers": [0], "num_heads": 4, "qkv_bias": 1}, words="qkv_bias")
        self.refused({"layers": [0], "num_heads": 4, "window_size": 0}, words="window_size")
        self.refused({"layers": [0], "num_heads": 4, "rope_theta": float("inf")},
                     words="rope_theta")
        self.refused({"layers": [0], "num_heads": 4, "rope_theta": -1}, words="rope_theta")
        self.refused("all", words="a dictionary, or a list")
        self.refused([3], words="must be a dictionary")

    def test_shapes_attention_cannot_run(self):
        self.refused({"layers": [0], "num_heads": 5}, words="multiple of num_heads")
        self.refused({"layers": [0], "num_heads": 4, "num_kv_heads": 3},
                     words="multiple of num_kv_heads")

    def test_types_without_hybrids_in_fla(self):
        self.refused({"layers": [0], "num_heads": 4}, model_type="rwkv7", words="RWKV7Block")
        self.refused({"layers": [0], "num_heads": 4}, model_type="mamba2", words="Mamba2Config")

    def test_defaults(self):
        c = ref.Config(config("retnet", [{"layers": [0, 2], "num_heads": 6}]))
        spec = c.attn_layers[2]
        self.assertIs(c.attn_layers[0], spec)
        self.assertEqual((spec["num_kv_heads"], spec["qkv_bias"], spec["window_size"],
                          spec["rope_theta"]), (6, False, None, 10000.0))
        self.assertNotIn(1, c.attn_layers)


if __name__ == "__main__":
    unittest.main()
