#!/usr/bin/python3
"""tools/train_tiny.py's training forms against linattn_ref's definitions.

The built-in model trains through a chunkwise form of the gated delta rule
and a Conv1d form of the short convolutions; what it exports is served (and
held to) linattn_ref's token-by-token recurrence. These tests hold the two
forms to each other in float64, where they differ only by rounding: the same
sums taken in another order (the unit lower-triangular solve included), so
about 1e-13 of the logits' size here. The bound 1e-9 leaves room for that and
catches any wrong term, which shows at the size of the logits themselves.
"""

import importlib.util
import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")
sys.path.insert(0, TOOLS)
spec = importlib.util.spec_from_file_location("train_tiny", os.path.join(TOOLS, "train_tiny.py"))
train_tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_tiny)
ref = train_tiny.linattn_ref
torch = train_tiny.torch

BOUND = 1e-9


def small_config(**changes):
    c = dict(train_tiny.CONFIG, hidden_size=48, head_dim=12, num_hidden_layers=2,
             intermediate_size=80, vocab_size=97)
    c.update(changes)
    return c


class ChunkwiseFormTest(unittest.TestCase):
    def assert_logits_equal(self, config, tokens, chunk, seed=5):
        model = ref.random_model(config, seed).double()
        with torch.no_grad():
            expected = model(tokens)  # linattn_ref: the recurrence, token by token
            got = train_tiny.forward_whole(model, tokens, chunk)
        scale = expected.abs().max().item()
        self.assertGreater(scale, 0.1)
        self.assertLess((got - expected).abs().max().item(), BOUND * scale)

    def test_model_logits_equal_the_recurrence(self):
        torch.manual_seed(1)
        tokens = torch.randint(0, 97, (2, 48))
        for chunk in (8, 16, 48):
            with self.subTest(chunk=chunk):
                self.assert_logits_equal(small_config(), tokens, chunk)

    def test_without_output_gate_and_with_two_value_widths(self):
        torch.manual_seed(2)
        tokens = torch.randint(0, 97, (1, 32))
        self.assert_logits_equal(small_config(use_gate=False, expand_v=2), tokens, 8)

    def test_strong_decay_and_full_beta(self):
        # Gates near 0 (exp(g) ~ 1e-3 per token) and beta near 1 push the
        # chunk factors to their extremes; nothing may overflow.
        torch.manual_seed(3)
        q, k = (ref.l2_normalise(torch.randn(2, 32, 3, 8, dtype=torch.float64)) for _ in "qk")
        v = torch.randn(2, 32, 3, 5, dtype=torch.float64)
        g = -7 * torch.rand(2, 32, 3, dtype=torch.float64)
        beta = 1 - 1e-3 * torch.rand(2, 32, 3, dtype=torch.float64)
        expected, _ = ref.gated_delta_recurrence(q, k, v, g, beta,
                                                 torch.zeros(2, 3, 8, 5, dtype=torch.float64))
        got = train_tiny.gated_delta_chunked(q, k, v, g, beta, chunk=16)
        self.assertTrue(torch.isfinite(got).all())
        self.assertLess((got - expected).abs().max().item(),
                        BOUND * expected.abs().max().item())

    def test_rwkv7_logits_equal_the_recurrence(self):
        torch.manual_seed(6)
        config = dict(train_tiny.RWKV7_CONFIG, hidden_size=48, head_dim=12, num_heads=4,
                      num_hidden_layers=3, intermediate_size=80, vocab_size=97,
                      decay_low_rank_dim=8, gate_low_rank_dim=16, a_low_rank_dim=8,
                      v_low_rank_dim=4)
        tokens = torch.randint(0, 97, (2, 48))
        for chunk in (8, 16, 48):
            with self.subTest(chunk=chunk):
                self.assert_logits_equal(config, tokens, chunk)

    def test_rwkv7_strongest_decay_from_a_state(self):
        # The fastest decay RWKV-7 can give (-0.607 per token, every
        # channel) over 16-token chunks: factors up to e^9.7 each way, and a
        # nonzero starting state carried through the chunks.
        torch.manual_seed(7)
        b, t, h, dk, dv = 2, 48, 3, 8, 5
        r, k = (torch.randn(b, t, h, dk, dtype=torch.float64) for _ in "rk")
        kk = ref.l2_normalise(torch.randn(b, t, h, dk, dtype=torch.float64))
        a = torch.rand(b, t, h, dk, dtype=torch.float64)
        v = torch.randn(b, t, h, dv, dtype=torch.float64)
        w = -0.6065306597126334 * (1 - 1e-3 * torch.rand(b, t, h, dk, dtype=torch.float64))
        s0 = torch.randn(b, h, dk, dv, dtype=torch.float64)
        expected, s_expected = ref.dplr_recurrence(r, k, v, -kk, kk * a, w, s0)
        got, s_got = train_tiny.dplr_chunked(r, k, v, -kk, kk * a, w, s0, 16)
        self.assertTrue(torch.isfinite(got).all())
        self.assertLess((got - expected).abs().max().item(),
                        BOUND * expected.abs().max().item())
        self.assertLess((s_got - s_expected).abs().max().item(),
                        BOUND * s_expected.abs().max().item())

    def test_convolution_equals_the_reference_from_an_empty_cache(self):
        torch.manual_seed(4)
        for silu in (True, False):
            conv = ref.ShortConvolution(6, 4, silu).double()
            with torch.no_grad():
                conv.weight.normal_()
            x = torch.randn(2, 9, 6, dtype=torch.float64)
            expected, _ = conv(x, torch.zeros(2, 3, 6, dtype=torch.float64))
            got = train_tiny.conv_whole(conv, x)
            self.assertLess((got - expected).abs().max().item(), 1e-12)

    def test_gradients_reach_every_parameter(self):
        torch.manual_seed(6)
        model = ref.random_model(small_config(), 7)
        tokens = torch.randint(0, 97, (2, 16))
        train_tiny.forward_whole(model, tokens, 8).logsumexp(-1).sum().backward()
        for name, p in model.named_parameters():
            self.assertIsNotNone(p.grad, name)
            self.assertTrue(torch.isfinite(p.grad).all(), name)
            self.assertGreater(p.grad.abs().max().item(), 0, name)


VERSES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good: and God divided the light from the darkness.",
] * 8


class TokenizerTest(unittest.TestCase):
    def test_same_verses_give_the_same_model_bytes(self):
        a = train_tiny.train_tokenizer(VERSES, 300)
        self.assertEqual(a, train_tiny.train_tokenizer(VERSES, 300))

    def test_piece_bytes_count_the_text_each_token_stands_for(self):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_proto=train_tiny.train_tokenizer(VERSES, 300))
        self.assertEqual(sp.get_piece_size(), 300)
        sizes = train_tiny.piece_bytes(sp)
        # Unseen letters (q, é) come back as bytes; the newline too.
        text = "And God said,\nLet there be quiet: café."
        ids = sp.encode(text)
        self.assertEqual(sp.decode(ids), text)
        # The encoder puts one space (the dummy prefix) before the text.
        self.assertEqual(int(sizes[ids].sum()), len(text.encode("utf-8")) + 1)
        self.assertEqual(sizes[0], 0)  # <unk>


if __name__ == "__main__":
    unittest.main()
