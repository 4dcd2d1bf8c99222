#!/usr/bin/python3
"""tools/linattn_ref.py's rwkv7 (written from fla's RWKV7ForCausalLM) against
BlinkDL's own statement of RWKV-7, RWKV-v7/rwkv_v7_numpy.py in
github.com/BlinkDL/RWKV-LM, restated below with its tensors named as BlinkDL's
checkpoints name them (blocks.N.att.*, blocks.N.ffn.*, emb, ln0, ln_out,
head) instead of read by position, and its head size a parameter (the file
fixes 64 and the group norm's eps at 64e-5 = head size x 1e-5).

Two independent readings of the same model: a disagreement means one of them
misreads RWKV-7. fla's fuse_norm = false is BlinkDL's F.normalize (eps 1e-12
on the norm); the numpy form has no other eps than its norms'.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import linattn_ref  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def layer_norm(x, w, b):
    return (x - x.mean()) / (x.var() + 1e-5) ** 0.5 * w + b


def group_norm(x, w, b, head_size):
    return ((x - x.mean(axis=1, keepdims=1)) /
            (x.var(axis=1, keepdims=1) + head_size * 1e-5) ** 0.5).flatten() * w + b


def mT(x):
    """numpy 2's .mT (Debian 12's numpy is 1.24)."""
    return np.swapaxes(x, -1, -2)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def time_mixing(p, x, v0, last_x, S, n_head, head_size, first):
    xr, xw, xk, xv, xa, xg = [x + p[m] * (last_x - x)
                              for m in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")]
    r = p["receptance.weight"] @ xr
    w = np.exp(-sigmoid(np.tanh(xw @ p["w1"]) @ p["w2"] + p["w0"]) / np.e ** 0.5)
    k = p["key.weight"] @ xk
    v = p["value.weight"] @ xv
    if first:
        v0 = v
    else:
        v = v + (v0 - v) * sigmoid(xv @ p["v1"] @ p["v2"] + p["v0"])
    a = sigmoid(xa @ p["a1"] @ p["a2"] + p["a0"])
    g = sigmoid(xg @ p["g1"]) @ p["g2"]
    kk = k * p["k_k"]
    k = k + k * (a - 1) * p["k_a"]
    r, w, k, v, kk, a, r_k = [t.reshape(n_head, head_size, 1)
                              for t in (r, w, k, v, kk, a, p["r_k"])]
    kk = kk / np.maximum(np.linalg.norm(kk, axis=1, keepdims=1), 1e-12)
    S = S * mT(w) - S @ kk * mT(kk * a) + v * mT(k)
    y = S @ r
    y = group_norm(y, p["ln_x.weight"], p["ln_x.bias"], head_size)
    y = y + ((r * k * r_k).sum(axis=1, keepdims=1) * v).flatten()
    return p["output.weight"] @ (y * g), v0, x, S


def channel_mixing(p, x, last_x):
    k = p["key.weight"] @ (x + p["x_k"] * (last_x - x))
    return p["value.weight"] @ np.maximum(k, 0) ** 2, x


def rwkv7_numpy(w, token, state, n_layer, n_head, head_size):
    x = w["emb.weight"][token]
    x = layer_norm(x, w["blocks.0.ln0.weight"], w["blocks.0.ln0.bias"])
    v0 = None
    for i in range(n_layer):
        att = {k[len(f"blocks.{i}.att."):]: v for k, v in w.items()
               if k.startswith(f"blocks.{i}.att.")}
        ffn = {k[len(f"blocks.{i}.ffn."):]: v for k, v in w.items()
               if k.startswith(f"blocks.{i}.ffn.")}
        x_ = layer_norm(x, w[f"blocks.{i}.ln1.weight"], w[f"blocks.{i}.ln1.bias"])
        dx, v0, state[0][i, 0], state[1][i] = time_mixing(
            att, x_, v0, state[0][i, 0], state[1][i], n_head, head_size, i == 0)
        x = x + dx
        x_ = layer_norm(x, w[f"blocks.{i}.ln2.weight"], w[f"blocks.{i}.ln2.bias"])
        dx, state[0][i, 1] = channel_mixing(ffn, x_, state[0][i, 1])
        x = x + dx
    x = layer_norm(x, w["ln_out.weight"], w["ln_out.bias"])
    return w["head.weight"] @ x, state


def blinkdl_names(sd):
    """fla's names to BlinkDL's (the inverse of fla's utils/convert_from_rwkv7.py:
    LoRA lora.0 / lora.2 weights are BlinkDL's x1 / x2 transposed, lora.2.bias
    its x0), squeezed to vectors where BlinkDL's code reads them so."""
    out = {}
    top = {"model.embeddings.weight": "emb.weight", "model.norm.weight": "ln_out.weight",
           "model.norm.bias": "ln_out.bias", "lm_head.weight": "head.weight"}
    parts = {"attn": "att", "ffn": "ffn", "pre_norm": "ln0", "attn_norm": "ln1",
             "ffn_norm": "ln2"}
    proj = {"r_proj": "receptance", "k_proj": "key", "v_proj": "value", "o_proj": "output",
            "g_norm": "ln_x"}
    for name, t in sd.items():
        t = t.detach().double().numpy()
        if name in top:
            out[top[name]] = t
            continue
        _, _, i, part, rest = name.split(".", 4)
        if part == "attn" and "_lora.lora." in rest:
            kind = rest[0]
            slot = rest.split("lora.lora.")[1]
            key = {"2.bias": "0", "0.weight": "1", "2.weight": "2"}[slot]
            out[f"blocks.{i}.att.{kind}{key}"] = t if slot == "2.bias" else t.T
            continue
        head, _, tail = rest.partition(".")
        if part == "attn" and head in proj:
            rest = proj[head] + "." + tail
        out[f"blocks.{i}.{parts[part]}.{rest}"] = t.reshape(-1) if t.ndim == 3 else t
    return out


def reference_logits(model, tokens):
    """A reference model's logits for `tokens` in one call, and token by
    token through its step (its recurrent state), and that state after."""
    with torch.no_grad():
        got = model(torch.tensor([tokens]))[0].numpy()
        states = model.new_state(1, torch.float64)
        stepped = []
        for t in tokens:
            logits, states = model.step(torch.tensor([t]), states)
            stepped.append(logits[0].numpy())
    return got, np.stack(stepped), states


class Rwkv7AgainstBlinkDL(unittest.TestCase):
    def check(self, hidden, head_size, layers, tokens, seed):
        config = {"model_type": "rwkv7", "hidden_size": hidden, "num_hidden_layers": layers,
                  "head_dim": head_size, "vocab_size": 97, "hidden_act": "sqrelu",
                  "norm_eps": 1e-5, "fuse_norm": False, "norm_first": True,
                  "norm_bias": True, "decay_low_rank_dim": 8, "a_low_rank_dim": 8,
                  "v_low_rank_dim": 4, "gate_low_rank_dim": 16, "intermediate_size": 3 * hidden,
                  "linattn_tokenizer": "bytes"}
        model = linattn_ref.random_model(config, seed).double().eval()
        w = blinkdl_names(model.state_dict())
        n_head = hidden // head_size
        state = (np.zeros((layers, 2, hidden)), np.zeros((layers, n_head, head_size, head_size)))
        expected = []
        for t in tokens:
            logits, state = rwkv7_numpy(w, t, state, layers, n_head, head_size)
            expected.append(logits)
        expected = np.stack(expected)
        # In one call, and token by token through the reference's step.
        got, stepped, states = reference_logits(model, tokens)
        scale = np.abs(expected).max()
        self.assertGreater(scale, 0.1)
        # Both in float64 through a few dozen operations per token: agreement
        # to ~1e-12 of the logits' size; 1e-9 leaves room, and any misread
        # term (a sign, a transpose, an eps) is orders larger.
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * scale)
        np.testing.assert_allclose(stepped, expected, rtol=0, atol=1e-9 * scale)
        # The numpy state after the last token is the reference's: S transposed
        # (BlinkDL keeps value x key), the shift rows as they are.
        for i in range(layers):
            attn_shift, ffn_shift, s = states[i]
            np.testing.assert_allclose(attn_shift[0].numpy(), state[0][i, 0], atol=1e-12)
            np.testing.assert_allclose(ffn_shift[0].numpy(), state[0][i, 1], atol=1e-12)
            np.testing.assert_allclose(s[0].transpose(-1, -2).numpy(), state[1][i],
                                       atol=1e-9 * max(1.0, np.abs(state[1][i]).max()))

    def test_two_layers_head_16(self):
        self.check(hidden=32, head_size=16, layers=2, tokens=[3, 50, 7, 7, 96, 0, 12, 41], seed=1)

    def test_three_layers_head_8(self):
        self.check(hidden=24, head_size=8, layers=3, tokens=list(range(0, 97, 5)), seed=2)

    def test_a_misread_term_is_caught(self):
        # The same comparison with the reference's removal term's sign flipped
        # must fail: the check sees the low-rank part of the transition.
        attention = linattn_ref.RWKV7Attention
        original = linattn_ref.dplr_recurrence
        try:
            attention.recurrence = staticmethod(
                lambda q, k, v, alpha, beta, gk, s: original(q, k, v, -alpha, beta, gk, s))
            with self.assertRaises(AssertionError):
                self.check(hidden=32, head_size=16, layers=2, tokens=[3, 50, 7, 7, 96], seed=1)
        finally:
            attention.recurrence = staticmethod(original)


if __name__ == "__main__":
    unittest.main()
