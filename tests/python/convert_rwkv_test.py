#!/usr/bin/python3
"""tools/convert_rwkv.py on RWKV-7 checkpoints written here in BlinkDL's own
names and shapes (RWKV-LM's RWKV-v7/train_temp/README.md weight table), as
torch.save writes them: the converted directory, run by tools/linattn_ref.py
(fla's layout), gives the logits of BlinkDL's own numpy statement of RWKV-7
(tests/python/rwkv7_reference_test.py) run on the original tensors by their
original names. And what is not an RWKV-7 checkpoint is refused by name.
"""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, HERE)
import convert_rwkv  # noqa: E402
import linattn_ref  # noqa: E402
import rwkv7_reference_test as blinkdl  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def blinkdl_frame(rng, vocab, c):
    """What RWKV-7 and RWKV-6 checkpoints share in BlinkDL's names: emb, ln0,
    ln_out, head (random, float64); blinkdl_block_norms adds each block's."""
    return {"emb.weight": rng.normal(0, 1, (vocab, c)),
            "blocks.0.ln0.weight": 1 + 0.1 * rng.normal(size=c),
            "blocks.0.ln0.bias": 0.1 * rng.normal(size=c),
            "ln_out.weight": 1 + 0.1 * rng.normal(size=c),
            "ln_out.bias": 0.1 * rng.normal(size=c),
            "head.weight": rng.normal(0, c ** -0.5, (vocab, c))}


def blinkdl_block_norms(rng, sd, i, c):
    """Block i's ln1 and ln2 into sd."""
    for n in ("ln1", "ln2"):
        sd[f"blocks.{i}.{n}.weight"] = 1 + 0.1 * rng.normal(size=c)
        sd[f"blocks.{i}.{n}.bias"] = 0.1 * rng.normal(size=c)


def blinkdl_checkpoint(rng, vocab=97, hidden=128, layers=3, head=64, ranks=(8, 8, 4, 16),
                       inter=256):
    """A random RWKV-7 state dict in BlinkDL's names and shapes, with the
    value ranges its initialisation gives (mixes in [0, 1], k_a about 1)."""
    rw, ra, rv, rg = ranks
    c = hidden
    sd = blinkdl_frame(rng, vocab, c)
    for i in range(layers):
        b = f"blocks.{i}."
        blinkdl_block_norms(rng, sd, i, c)
        a = b + "att."
        for m in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            sd[a + m] = rng.uniform(0, 1, (1, 1, c))
        for kind, r in (("w", rw), ("a", ra), ("v", rv)):
            sd[a + kind + "0"] = rng.normal(0, 0.5, (1, 1, c))
            sd[a + kind + "1"] = rng.normal(0, c ** -0.5, (c, r))
            sd[a + kind + "2"] = rng.normal(0, r ** -0.5, (r, c))
        sd[a + "g1"] = rng.normal(0, c ** -0.5, (c, rg))
        sd[a + "g2"] = rng.normal(0, rg ** -0.5, (rg, c))
        sd[a + "k_k"] = 0.7 + 0.1 * rng.normal(size=(1, 1, c))
        sd[a + "k_a"] = 1 + 0.1 * rng.normal(size=(1, 1, c))
        sd[a + "r_k"] = rng.normal(0, 0.1, (c // head, head))
        for n in ("receptance", "key", "value", "output"):
            sd[a + n + ".weight"] = rng.normal(0, c ** -0.5, (c, c))
        sd[a + "ln_x.weight"] = 1 + 0.1 * rng.normal(size=c)
        sd[a + "ln_x.bias"] = 0.1 * rng.normal(size=c)
        f = b + "ffn."
        sd[f + "x_k"] = rng.uniform(0, 1, (1, 1, c))
        sd[f + "key.weight"] = rng.normal(0, c ** -0.5, (inter, c))
        sd[f + "value.weight"] = rng.normal(0, inter ** -0.5, (c, inter))
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in sd.items()}


def random_time_state(rng, layers, heads, head, scale, dtype=torch.float32):
    """An RWKV-7 state file's tensors: blocks.<i>.att.time_state of (heads,
    head, head) per layer."""
    return {f"blocks.{i}.att.time_state":
            torch.tensor(rng.normal(0, scale, (heads, head, head)), dtype=dtype)
            for i in range(layers)}


def numpy_logits(sd, tokens, layers, hidden, head, time_state=None):
    """BlinkDL's numpy statement on the checkpoint's own tensors (squeezed
    as its loader squeezes them), float64; `time_state` (a state file's
    tensors) starts each layer's S as RWKV's pipelines load one: as it is,
    value x key, which is the numpy statement's own orientation (S @ r)."""
    w = {k: v.double().numpy() for k, v in sd.items()}
    w = {k: (v.reshape(-1) if v.ndim == 3 else v) for k, v in w.items()}
    n_head = hidden // head
    state = (np.zeros((layers, 2, hidden)), np.zeros((layers, n_head, head, head)))
    if time_state is not None:
        for i in range(layers):
            state[1][i] = time_state[f"blocks.{i}.att.time_state"].double().numpy()
    out = []
    for t in tokens:
        logits, state = blinkdl.rwkv7_numpy(w, t, state, layers, n_head, head)
        out.append(logits)
    return np.stack(out)


class ConvertRwkvTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, sd, name="m", **kw):
        pth = os.path.join(self.dir, name + ".pth")
        torch.save(sd, pth)
        out = os.path.join(self.dir, name)
        return convert_rwkv.convert(pth, out, **kw), out

    def test_converted_model_computes_blinkdls_model(self):
        sd = blinkdl_checkpoint(np.random.default_rng(3))
        (config, dtype, n), out = self.convert(sd)
        self.assertEqual(dtype, "F32")
        # Layer 0's v0/v1/v2 are dropped; everything else is one tensor each.
        self.assertEqual(n, len(sd) - 3)
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)
        self.assertEqual(written, config)
        for field, value in (("vocab_size", 97), ("hidden_size", 128), ("num_hidden_layers", 3),
                             ("head_dim", 64), ("num_heads", 2), ("intermediate_size", 256),
                             ("decay_low_rank_dim", 8), ("a_low_rank_dim", 8),
                             ("v_low_rank_dim", 4), ("gate_low_rank_dim", 16),
                             ("fuse_norm", False), ("norm_first", True), ("eos_token_id", 0)):
            self.assertEqual(config[field], value, field)
        model = linattn_ref.load_model(out, torch.float64)
        tokens = [5, 17, 17, 96, 0, 44, 3, 80, 12]
        with torch.no_grad():
            got = model(torch.tensor([tokens]))[0].numpy()
        expected = numpy_logits(sd, tokens, 3, 128, 64)
        scale = np.abs(expected).max()
        self.assertGreater(scale, 0.1)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * scale)

    def test_bf16_checkpoint_stays_bf16_and_exact(self):
        sd = {k: v.to(torch.bfloat16)
              for k, v in blinkdl_checkpoint(np.random.default_rng(4), layers=2).items()}
        (config, dtype, _), out = self.convert(sd, "bf16")
        self.assertEqual(dtype, "BF16")
        tensors = linattn_ref.read_safetensors(os.path.join(out, "model.safetensors"))
        # BF16 values pass through float32 unchanged; w1 comes back transposed.
        np.testing.assert_array_equal(
            tensors["model.layers.1.attn.w_lora.lora.0.weight"],
            sd["blocks.1.att.w1"].float().numpy().T)
        np.testing.assert_array_equal(tensors["model.layers.0.attn.k_k"],
                                      sd["blocks.0.att.k_k"].float().numpy().reshape(-1))

    def test_vocabulary_is_copied_and_head_may_be_tied(self):
        sd = blinkdl_checkpoint(np.random.default_rng(5), layers=1)
        del sd["head.weight"]
        vocab = os.path.join(self.dir, convert_rwkv.VOCAB_FILE)
        with open(vocab, "w") as f:
            f.write("1 '\\x00' 1\n")
        (config, _, _), out = self.convert(sd, "tied", vocab=vocab)
        self.assertTrue(config["tie_word_embeddings"])
        self.assertEqual(config["v_low_rank_dim"], 32)  # one layer: no v LoRA to read
        self.assertTrue(os.path.exists(os.path.join(out, convert_rwkv.VOCAB_FILE)))
        linattn_ref.load_model(out)  # loads with the embeddings as the head

    def test_state_files_keep_names_and_orientation(self):
        rng = np.random.default_rng(8)
        st = random_time_state(rng, 3, 2, 64, 1.0, torch.bfloat16)
        pth = os.path.join(self.dir, "state.pth")
        torch.save(st, pth)
        out = os.path.join(self.dir, "state.safetensors")
        self.assertEqual(convert_rwkv.convert_state(pth, out), (3, (2, 64, 64)))
        back = linattn_ref.read_safetensors(out)
        self.assertEqual(sorted(back), sorted(st))
        for name, t in st.items():
            np.testing.assert_array_equal(back[name], t.float().numpy())
        bad = [({}, "no blocks.0.att.time_state"),
               ({**st, "blocks.0.att.x_r": torch.zeros(1, 1, 128)}, "blocks.0.att.x_r"),
               ({**st, "blocks.7.att.time_state": torch.zeros(2, 64, 64)}, "blocks.7"),
               ({"blocks.0.att.time_state": torch.zeros(128, 64)}, "not (heads"),
               ({"blocks.0.att.time_state": torch.zeros(2, 64, 64),
                 "blocks.1.att.time_state": torch.zeros(2, 32, 32)}, "differ in shape")]
        for i, (sd, words) in enumerate(bad):
            with self.subTest(words):
                torch.save(sd, pth)
                with self.assertRaises(ValueError) as e:
                    convert_rwkv.convert_state(pth, out)
                self.assertIn(words, str(e.exception))

    def test_what_is_not_rwkv7_is_refused_by_name(self):
        rng = np.random.default_rng(6)
        cases = []
        # time_maa_x marks RWKV-6 (tests/python/rwkv6_reference_test.py):
        # amid RWKV-7's tensors, RWKV-6's own are missing.
        rwkv6 = blinkdl_checkpoint(rng, layers=1)
        rwkv6["blocks.0.att.time_maa_x"] = torch.zeros(1, 1, 128)
        cases.append((rwkv6, "blocks.0.att.time_faaaa is missing"))
        cases.append((blinkdl_checkpoint(rng, hidden=64, head=32, layers=1), "head size 32"))
        stray = blinkdl_checkpoint(rng, layers=1)
        stray["blocks.0.att.time_first"] = torch.zeros(2)
        cases.append((stray, "blocks.0.att.time_first"))
        missing = blinkdl_checkpoint(rng, layers=1)
        del missing["blocks.0.att.r_k"]
        cases.append((missing, "blocks.0.att.r_k is missing"))
        ints = blinkdl_checkpoint(rng, layers=1)
        ints["blocks.0.att.k_k"] = torch.zeros(1, 1, 128, dtype=torch.int32)
        cases.append((ints, "only F32, F16 and BF16"))
        cases.append(({"emb.weight": [1, 2, 3]}, "not a tensor"))
        for i, (sd, words) in enumerate(cases):
            with self.subTest(words):
                with self.assertRaises(ValueError) as e:
                    self.convert(sd, f"bad{i}")
                self.assertIn(words, str(e.exception))


if __name__ == "__main__":
    unittest.main()
