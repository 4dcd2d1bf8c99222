#!/usr/bin/python3
"""tools/linattn_ref.py's rwkv6 (written from fla's RWKV6ForCausalLM) and
tools/convert_rwkv.py's RWKV-6 path against BlinkDL's own statement of
RWKV-6: the RNN-mode time_mixing and channel_mixing of RWKV-v5/rwkv_v6_demo.py
in github.com/BlinkDL/RWKV-LM, restated below in numpy, float64, with its
tensors read by the names BlinkDL's checkpoints give them (blocks.N.att.*,
blocks.N.ffn.*, emb, ln0, ln1, ln2, ln_out, head).

A random checkpoint in those names goes through the converter into fla's
layout and runs in the reference: both must give the numpy statement's
logits on the original tensors. Two independent readings of the same model
(and the converter's map between them): a disagreement means one misreads
RWKV-6.
"""

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, HERE)
import convert_rwkv  # noqa: E402
import linattn_ref  # noqa: E402
from convert_rwkv_test import blinkdl_block_norms, blinkdl_frame  # noqa: E402
from rwkv7_reference_test import layer_norm, reference_logits, sigmoid  # noqa: E402
import rwkv7_reference_test  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def group_norm(x, w, b):
    """F.group_norm over heads (rows of x), eps 64e-5 as the demo has it
    (RWKV-7's statement's group norm at 64 × 1e-5)."""
    return rwkv7_reference_test.group_norm(x, w, b, 64)


def time_mixing(p, x, last_x, s, n_head, head_size):
    """The demo's time_mixing: x_maa = time_maa_x, w/k/v/r/g_maa =
    time_maa_w/k/v/r/g, tm_w1/2 = time_maa_w1/2, td_w1/2 = time_decay_w1/2,
    time_first = time_faaaa, ln_w/b = ln_x."""
    H, S = n_head, head_size
    sx = last_x - x
    xxx = x + sx * p["time_maa_x"]
    xxx = np.tanh(xxx @ p["time_maa_w1"]).reshape(5, 1, -1)
    xxx = np.matmul(xxx, p["time_maa_w2"]).reshape(5, -1)
    mw, mk, mv, mr, mg = xxx
    xw = x + sx * (p["time_maa_w"] + mw)
    xk = x + sx * (p["time_maa_k"] + mk)
    xv = x + sx * (p["time_maa_v"] + mv)
    xr = x + sx * (p["time_maa_r"] + mr)
    xg = x + sx * (p["time_maa_g"] + mg)
    w = (p["time_decay"] + np.tanh(xw @ p["time_decay_w1"]) @ p["time_decay_w2"])
    w = np.exp(-np.exp(w.reshape(H, S, 1)))
    r = (p["receptance.weight"] @ xr).reshape(H, 1, S)
    k = (p["key.weight"] @ xk).reshape(H, S, 1)
    v = (p["value.weight"] @ xv).reshape(H, 1, S)
    g = p["gate.weight"] @ xg
    g = g * sigmoid(g)  # F.silu
    a = k @ v
    y = r @ (p["time_faaaa"].reshape(H, S, 1) * a + s)
    s = a + w * s
    y = group_norm(y.reshape(H, S), p["ln_x.weight"], p["ln_x.bias"]) * g
    return p["output.weight"] @ y, x, s


def channel_mixing(p, x, last_x):
    sx = last_x - x
    xk = x + sx * p["time_maa_k"]
    xr = x + sx * p["time_maa_r"]
    r = sigmoid(p["receptance.weight"] @ xr)
    k = np.square(np.maximum(p["key.weight"] @ xk, 0))
    return r * (p["value.weight"] @ k), x


def rwkv6_numpy(w, token, state, n_layer, n_head, head_size):
    """One token through the model; state = (token-shift rows (layers, 2,
    hidden), S (layers, heads, head, head))."""
    x = w["emb.weight"][token]
    x = layer_norm(x, w["blocks.0.ln0.weight"], w["blocks.0.ln0.bias"])
    for i in range(n_layer):
        att = {k[len(f"blocks.{i}.att."):]: v for k, v in w.items()
               if k.startswith(f"blocks.{i}.att.")}
        ffn = {k[len(f"blocks.{i}.ffn."):]: v for k, v in w.items()
               if k.startswith(f"blocks.{i}.ffn.")}
        x_ = layer_norm(x, w[f"blocks.{i}.ln1.weight"], w[f"blocks.{i}.ln1.bias"])
        dx, state[0][i, 0], state[1][i] = time_mixing(
            att, x_, state[0][i, 0], state[1][i], n_head, head_size)
        x = x + dx
        x_ = layer_norm(x, w[f"blocks.{i}.ln2.weight"], w[f"blocks.{i}.ln2.bias"])
        dx, state[0][i, 1] = channel_mixing(ffn, x_, state[0][i, 1])
        x = x + dx
    x = layer_norm(x, w["ln_out.weight"], w["ln_out.bias"])
    return w["head.weight"] @ x, state


def blinkdl_checkpoint(rng, vocab=97, hidden=128, layers=3, head=32, mix_rank=8,
                       decay_rank=16, inter=224):
    """A random RWKV-6 state dict in BlinkDL's names and shapes (RWKV_Tmix_x060,
    RWKV_CMix_x060), with the value ranges its initialisation gives (mixes in
    [0, 1], decays exp(-exp(w)) for w about -6 to 1)."""
    c = hidden
    sd = blinkdl_frame(rng, vocab, c)
    for i in range(layers):
        b = f"blocks.{i}."
        blinkdl_block_norms(rng, sd, i, c)
        a = b + "att."
        for m in ("x", "w", "k", "v", "r", "g"):
            sd[a + "time_maa_" + m] = rng.uniform(0, 1, (1, 1, c))
        sd[a + "time_maa_w1"] = rng.normal(0, c ** -0.5, (c, 5 * mix_rank))
        sd[a + "time_maa_w2"] = rng.normal(0, mix_rank ** -0.5, (5, mix_rank, c))
        sd[a + "time_decay"] = rng.uniform(-6, 1, (1, 1, c))
        sd[a + "time_decay_w1"] = rng.normal(0, c ** -0.5, (c, decay_rank))
        sd[a + "time_decay_w2"] = rng.normal(0, 0.5 * decay_rank ** -0.5, (decay_rank, c))
        sd[a + "time_faaaa"] = rng.normal(0, 0.5, (c // head, head))
        for n in ("receptance", "key", "value", "gate", "output"):
            sd[a + n + ".weight"] = rng.normal(0, c ** -0.5, (c, c))
        sd[a + "ln_x.weight"] = 1 + 0.1 * rng.normal(size=c)
        sd[a + "ln_x.bias"] = 0.1 * rng.normal(size=c)
        f = b + "ffn."
        sd[f + "time_maa_k"] = rng.uniform(0, 1, (1, 1, c))
        sd[f + "time_maa_r"] = rng.uniform(0, 1, (1, 1, c))
        sd[f + "key.weight"] = rng.normal(0, c ** -0.5, (inter, c))
        sd[f + "receptance.weight"] = rng.normal(0, c ** -0.5, (c, c))
        sd[f + "value.weight"] = rng.normal(0, inter ** -0.5, (c, inter))
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in sd.items()}


def numpy_logits(sd, tokens, layers, hidden, head, time_state=None):
    """The numpy statement on the checkpoint's own tensors (its (1, 1, C)
    vectors squeezed as BlinkDL's loader squeezes them), float64.
    `time_state` (a state file's tensors) starts each layer's S: RWKV-6's
    state kernel (RWKV-v5/cuda/wkv6state_cuda.cu) reads a head's
    time_state as value x key, the RNN form's s is key x value."""
    w = {k: v.double().numpy() for k, v in sd.items()}
    w = {k: (v.reshape(-1) if v.ndim == 3 and v.shape[0] == 1 else v) for k, v in w.items()}
    n_head = hidden // head
    state = (np.zeros((layers, 2, hidden)), np.zeros((layers, n_head, head, head)))
    if time_state is not None:
        for i in range(layers):
            state[1][i] = time_state[f"blocks.{i}.att.time_state"].double().numpy().transpose(
                0, 2, 1)
    out = []
    for t in tokens:
        logits, state = rwkv6_numpy(w, t, state, layers, n_head, head)
        out.append(logits)
    return np.stack(out)


class Rwkv6AgainstBlinkDL(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, sd, name="m"):
        pth = os.path.join(self.dir, name + ".pth")
        torch.save(sd, pth)
        out = os.path.join(self.dir, name)
        return convert_rwkv.convert(pth, out), out

    def test_the_converted_model_computes_blinkdls_model(self):
        sd = blinkdl_checkpoint(np.random.default_rng(3))
        (config, dtype, n), out = self.convert(sd)
        self.assertEqual(dtype, "F32")
        # The five mixes become one x_bias: four tensors fewer per layer.
        self.assertEqual(n, len(sd) - 4 * 3)
        for field, value in (("model_type", "rwkv6"), ("vocab_size", 97), ("hidden_size", 128),
                             ("num_hidden_layers", 3), ("num_heads", 4), ("expand_k", 1.0),
                             ("expand_v", 1.0), ("proj_low_rank_dim", 8),
                             ("gate_low_rank_dim", 16), ("intermediate_size", 224),
                             ("linattn_group_norm_eps", 64e-5), ("norm_first", True),
                             ("eos_token_id", 0)):
            self.assertEqual(config[field], value, field)
        model = linattn_ref.load_model(out, torch.float64)
        tokens = [5, 17, 17, 96, 0, 44, 3, 80, 12]
        # In one call, and token by token through the reference's step.
        got, stepped, _ = reference_logits(model, tokens)
        expected = numpy_logits(sd, tokens, 3, 128, 32)
        scale = np.abs(expected).max()
        self.assertGreater(scale, 0.1)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * scale)
        np.testing.assert_allclose(stepped, expected, rtol=0, atol=1e-9 * scale)

    def test_the_group_norm_eps_is_blinkdls(self):
        # fla's own eps (norm_eps, 1e-5) is a different model: the converted
        # directory must carry BlinkDL's 64e-5 for the logits above to hold.
        sd = blinkdl_checkpoint(np.random.default_rng(4), layers=1)
        (config, _, _), out = self.convert(sd)
        tokens = [1, 2, 3]
        expected = numpy_logits(sd, tokens, 1, 128, 32)
        c = linattn_ref.load_config(out)
        self.assertEqual(c.group_norm_eps, 64e-5)
        del c.raw["linattn_group_norm_eps"]
        fla_eps = linattn_ref.Config(c.raw)
        self.assertEqual(fla_eps.group_norm_eps, 1e-5)
        model = linattn_ref.load_model(out, torch.float64)
        model.model.layers[0].attn.g_norm.eps = fla_eps.group_norm_eps
        with torch.no_grad():
            got = model(torch.tensor([tokens]))[0].numpy()
        self.assertGreater(np.abs(got - expected).max(), 1e-9 * np.abs(expected).max())

    def test_what_is_not_rwkv6_is_refused_by_name(self):
        rng = np.random.default_rng(6)
        cases = []
        missing = blinkdl_checkpoint(rng, layers=1)
        del missing["blocks.0.att.time_faaaa"]
        cases.append((missing, "blocks.0.att.time_faaaa is missing"))
        gate = blinkdl_checkpoint(rng, layers=2)
        del gate["blocks.1.att.gate.weight"]
        cases.append((gate, "blocks.1.att.gate.weight is missing"))
        stray = blinkdl_checkpoint(rng, layers=1)
        stray["blocks.0.att.k_k"] = torch.zeros(1, 1, 128)
        cases.append((stray, "blocks.0.att.k_k: not a tensor of an RWKV-6 model"))
        odd = blinkdl_checkpoint(rng, layers=1)
        odd["blocks.0.att.time_maa_w1"] = torch.zeros(128, 41)
        cases.append((odd, "not 5 x a rank"))
        heads = blinkdl_checkpoint(rng, layers=1)
        heads["blocks.0.att.time_faaaa"] = torch.zeros(3, 32)
        cases.append((heads, "not heads x head size"))
        for sd, words in cases:
            with self.subTest(words):
                with self.assertRaises(ValueError) as e:
                    self.convert(sd, "bad")
                self.assertIn(words, str(e.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
