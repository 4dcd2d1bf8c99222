#!/usr/bin/python3
"""Known answers for tools/linattn_ref.py's feature maps.

Every expected vector below was worked out by hand from fla's definitions
(fla/modules/feature_map.py and the inline maps of fla/layers/linear_attn.py),
not from running any code, so the reference that the C++ forward is checked
against is itself checked against fla. A reference that followed the DPFP
paper instead (relu(-x) in the second half) fails here.
"""

import importlib.util
import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REF_PATH = os.path.join(HERE, "..", "..", "tools", "linattn_ref.py")
spec = importlib.util.spec_from_file_location("linattn_ref", REF_PATH)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
torch = ref.torch


def t(values):
    return torch.tensor(values, dtype=torch.float64)


class DpfpTest(unittest.TestCase):
    def test_positive_input(self):
        # x = [1, 2]: relu = [1, 2]; x2 = [relu, -relu] = [1, 2, -1, -2].
        # roll(x2, j)[i] = x2[(i - j) mod 4]:
        #   j=1 [-2, 1, 2, -1] -> x2 * it = [-2, 2, -2, 2]
        #   j=2 [-1, -2, 1, 2] ->           [-1, -4, -1, -4]
        #   j=3 [2, -1, -2, 1] ->           [2, -2, 2, -2]
        #   j=4 x2 itself      ->           [1, 4, 1, 4]
        got = ref.dpfp(t([1.0, 2.0]))
        want = [-2, 2, -2, 2, -1, -4, -1, -4, 2, -2, 2, -2, 1, 4, 1, 4]
        self.assertEqual(got.tolist(), want)

    def test_mixed_signs(self):
        # x = [1, -3]: relu = [1, 0]; x2 = [1, 0, -1, 0].
        #   j=1 [0, 1, 0, -1] -> [0, 0, 0, 0]
        #   j=2 [-1, 0, 1, 0] -> [-1, 0, -1, 0]
        #   j=3 [0, -1, 0, 1] -> [0, 0, 0, 0]
        #   j=4 [1, 0, -1, 0] -> [1, 0, 1, 0]
        got = ref.dpfp(t([1.0, -3.0]))
        want = [0, 0, 0, 0, -1, 0, -1, 0, 0, 0, 0, 0, 1, 0, 1, 0]
        self.assertEqual(got.tolist(), want)

    def test_batched_rows_are_independent(self):
        x = t([[1.0, 2.0], [1.0, -3.0]])
        got = ref.dpfp(x)
        self.assertEqual(got[0].tolist(), ref.dpfp(x[0]).tolist())
        self.assertEqual(got[1].tolist(), ref.dpfp(x[1]).tolist())
        self.assertEqual(list(got.shape), [2, 16])


class FixedMapsTest(unittest.TestCase):
    def test_elu_plus_one(self):
        got = ref.elu1(t([0.0, -1.0, 2.0]))
        self.assertEqual(got[0].item(), 1.0)
        self.assertAlmostEqual(got[1].item(), math.exp(-1.0), places=15)
        self.assertEqual(got[2].item(), 3.0)


class LearnedMapsTest(unittest.TestCase):
    def test_hedgehog_at_its_identity_initialisation(self):
        # layer = identity, bias 0: y = 2x = [1, -0.5]; softmax over
        # [1, -0.5, -1, 0.5].
        m = ref.Hedgehog(2).double()
        got = m(t([0.5, -0.25])).tolist()
        e = [math.exp(v) for v in (1.0, -0.5, -1.0, 0.5)]
        want = [v / sum(e) for v in e]
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, places=15)

    def test_t2r_has_no_bias(self):
        m = ref.T2R(3)
        self.assertIsNone(m.layer.bias)

    def test_hadamard_multiplies_two_affine_maps(self):
        m = ref.Hadamard(2).double()
        with torch.no_grad():
            m.layer1.weight.copy_(t([[1.0, 0.0], [0.0, 2.0]]))
            m.layer1.bias.copy_(t([1.0, 0.0]))
            m.layer2.weight.copy_(t([[0.0, 1.0], [1.0, 0.0]]))
            m.layer2.bias.copy_(t([0.0, -1.0]))
        # layer1([3, 4]) = [4, 8]; layer2([3, 4]) = [4, 2].
        self.assertEqual(m(t([3.0, 4.0])).tolist(), [16.0, 16.0])


class ConfigTest(unittest.TestCase):
    def test_unsupported_parts_are_refused(self):
        # (fla's `attn` hybrids are built: hybrid_reference_test.py.)
        with self.assertRaises(ValueError):
            ref.Config({"feature_map": "elu", "attnres_block_size": 4})


if __name__ == "__main__":
    unittest.main(verbosity=2)
