#!/usr/bin/python3
"""Known answers for tools/linattn_ref.py's retnet, gla, delta_net,
gated_deltanet and mamba2 mixers.

Each expected value is worked out by hand from fla's definitions
(fla/layers/mamba2.py, fla/modules/layernorm_gated.py,
fla/models/mamba2/configuration_mamba2.py,
fla/layers/multiscale_retention.py, fla/modules/rotary.py,
fla/ops/retention/, fla/layers/gla.py, fla/ops/gla/naive.py, fla/layers/gated_deltanet.py,
fla/layers/delta_net.py,
fla/ops/gated_delta_rule/fused_recurrent.py, fla/ops/delta_rule/,
fla/modules/conv/short_conv.py), not by running code, so that the reference
the C++ forward will be checked against is itself checked against fla.
"""

import importlib.util
import json
import math
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REF_PATH = os.path.join(HERE, "..", "..", "tools", "linattn_ref.py")
spec = importlib.util.spec_from_file_location("linattn_ref", REF_PATH)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
torch = ref.torch


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def silu(x):
    return x / (1 + math.exp(-x))


def assert_prefill_equals_steps(test, config, seed=3):
    """A random model's whole-sequence logits equal its token-by-token ones
    (the same operations in the same order)."""
    model = ref.random_model(config, seed).double()
    toks = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        whole = model(toks)[0]
        states = model.new_state(1, torch.float64)
        for i in range(toks.shape[1]):
            logits, states = model.step(toks[:, i], states)
            test.assertTrue(torch.allclose(logits[0], whole[i], rtol=0, atol=1e-12))


def small_config(**over):
    c = {"model_type": "gated_deltanet", "hidden_size": 4, "num_hidden_layers": 1,
         "num_heads": 2, "head_dim": 2, "expand_v": 1, "vocab_size": 8,
         "use_short_conv": False}
    c.update(over)
    return ref.Config(c)


class RecurrenceTest(unittest.TestCase):
    def test_two_tokens_by_hand(self):
        # One head, K = 2, V = 1, S0 = [[2], [0]].
        # Token 1: exp(g) = 0.5, k = [1, 0], v = 3, beta = 0.5, q = [1, 1]:
        #   S = 0.5 S0 = [[1], [0]]; S^T k = 1; u = 0.5 (3 - 1) = 1;
        #   S = [[1], [0]] + [1, 0]^T * 1 = [[2], [0]]; o = S^T q = 2.
        # Token 2: g = 0, k = [0, 1], v = -1, beta = 1, q = [1, 2]:
        #   S^T k = 0; u = -1; S = [[2], [-1]]; o = 2 - 2 = 0.
        q = t([[[[1, 1]], [[1, 2]]]])
        k = t([[[[1, 0]], [[0, 1]]]])
        v = t([[[[3]], [[-1]]]])
        g = t([[[math.log(0.5)], [0.0]]])
        beta = t([[[0.5], [1.0]]])
        s0 = t([[[[2], [0]]]])
        o, s = ref.gated_delta_recurrence(q, k, v, g, beta, s0)
        self.assertEqual(o.flatten().tolist(), [2.0, 0.0])
        self.assertEqual(s.flatten().tolist(), [2.0, -1.0])


class ShortConvolutionTest(unittest.TestCase):
    def test_taps_in_time_order_then_silu(self):
        # W = 3, weight [w0, w1, w2] = [1, 2, 3], x = [1, 0, 0]:
        # y_t = silu(w0 x_{t-2} + w1 x_{t-1} + w2 x_t) -> silu(3), silu(2), silu(1);
        # the cache keeps the last W - 1 = 2 inputs, [0, 0].
        conv = ref.ShortConvolution(1, 3).double()
        with torch.no_grad():
            conv.weight.copy_(t([[[1, 2, 3]]]))
        y, cache = conv(t([[[1], [0], [0]]]), torch.zeros(1, 2, 1, dtype=torch.float64))
        for got, want in zip(y.flatten().tolist(), [silu(3), silu(2), silu(1)]):
            self.assertAlmostEqual(got, want, places=14)
        self.assertEqual(cache.flatten().tolist(), [0.0, 0.0])
        # Continuing from that cache with x = 5: silu(w2 * 5) = silu(15).
        y2, _ = conv(t([[[5]]]), cache)
        self.assertAlmostEqual(y2.item(), silu(15), places=12)


class LayerTest(unittest.TestCase):
    def mixer(self, **over):
        m = ref.GatedDeltaNet(small_config(**over)).double()
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
            m.o_norm.weight.fill_(1)
        return m

    def test_gate_and_beta_formulas(self):
        # g = -exp(A_log) softplus(a + dt_bias): A_log = ln 2, a = 0,
        # dt_bias = 0 -> g = -2 ln 2, exp(g) = 1/4.
        # beta = sigmoid(0) = 1/2, doubled with allow_neg_eigval.
        # With q = k = 0 (zero projections: silu(0) = 0 and the L2 norm of 0
        # is 0), the state only decays: S = S0 / 4 per token.
        for neg in (False, True):
            m = self.mixer(allow_neg_eigval=neg)
            with torch.no_grad():
                m.A_log.fill_(math.log(2))
            s0 = torch.ones(1, 2, 2, 2, dtype=torch.float64)
            _, (s,) = m.run(torch.zeros(1, 1, 4, dtype=torch.float64), (s0,))
            self.assertTrue(torch.allclose(s, s0 / 4, rtol=0, atol=1e-15))

    def test_value_heads_read_query_key_head_hv_div_group(self):
        # num_heads 2, num_v_heads 4: value heads 0, 1 read q/k head 0 and
        # value heads 2, 3 read head 1 (the kernel's i_h = i_hv // (HV // H)).
        # Head 0's keys come from x, head 1's keys are zero: only value heads
        # 0 and 1 write their state.
        m = self.mixer(num_v_heads=4)
        with torch.no_grad():
            m.k_proj.weight[0:2, 0:2] = torch.eye(2, dtype=torch.float64)
            m.v_proj.weight.fill_(1)
            m.b_proj.weight.fill_(0)
        x = t([[[1, 2, 3, 4]]])
        _, (s,) = m.run(x, (torch.zeros(1, 4, 2, 2, dtype=torch.float64),))
        written = [bool(s[0, hv].abs().sum() > 0) for hv in range(4)]
        self.assertEqual(written, [True, True, False, False])

    def test_state_after_one_token_by_hand(self):
        # One head, K = 2, V = 1, no convolution: k = silu(x0) e0 before the
        # norm, k̂ = silu(x0) / sqrt(silu(x0)^2 + 1e-6) e0, v = silu(x1),
        # beta = sigmoid(50) = 1 to double precision, g ~ 0 (exp(A_log) ~ 0):
        # from S = 0, u = beta (v - 0) = v and S = k̂ u^T.
        m = self.mixer(num_heads=1, head_dim=2, expand_v=0.5, num_v_heads=1)
        with torch.no_grad():
            m.k_proj.weight[0, 0] = 1
            m.v_proj.weight[0, 1] = 1
            m.b_proj.weight[0, 2] = 1
            m.A_log.fill_(-100)
        x = t([[[2.0, 3.0, 50.0, 0.0]]])
        _, (s,) = m.run(x, m.new_state(1, torch.float64))
        kn = silu(2.0) / math.sqrt(silu(2.0) ** 2 + 1e-6)
        self.assertAlmostEqual(s[0, 0, 0, 0].item(), kn * silu(3.0), places=12)
        self.assertEqual(s[0, 0, 1, 0].item(), 0.0)

    def test_prefill_equals_token_by_token(self):
        assert_prefill_equals_steps(
            self, {"model_type": "gated_deltanet", "hidden_size": 16, "num_hidden_layers": 2,
                   "num_heads": 2, "num_v_heads": 4, "head_dim": 4, "expand_v": 2,
                   "vocab_size": 20})


def delta_net(**over):
    # hidden 4, one head, key_dim 2, value_dim 1, every weight 0.
    c = {"model_type": "delta_net", "hidden_size": 4, "num_hidden_layers": 1,
         "num_heads": 1, "expand_k": 0.5, "expand_v": 0.25, "vocab_size": 8,
         "use_short_conv": False}
    c.update(over)
    m = ref.DeltaNet(ref.Config(c)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.o_norm.weight.fill_(1)
        # k = x[0:2], v from x[2].
        m.k_proj.weight[0, 0] = 1
        m.k_proj.weight[1, 1] = 1
        m.v_proj.weight[0, 2] = 1
    return m


class DeltaNetTest(unittest.TestCase):
    def state_after(self, m, x):
        _, state = m.run(t([[x]]), m.new_state(1, torch.float64))
        return state[0][0, 0, :, 0].tolist()  # S (K = 2, V = 1) of the head

    def test_identity_activation_leaves_keys_raw_but_v_gets_silu(self):
        # qk_activation 'identity' with the convolution: its taps [0, 0, 0, 1]
        # pass the current input, and only v's convolution has SiLU:
        # k = [-2, 1] -> k̂ = [-2, 1] / sqrt(5 + 1e-6); v = silu(3);
        # beta = sigmoid(0) = 1/2; S = k̂ (beta v).
        m = delta_net(qk_activation="identity", use_short_conv=True)
        with torch.no_grad():
            for conv in (m.q_conv1d, m.k_conv1d, m.v_conv1d):
                conv.weight[:, 0, 3] = 1
        n = math.sqrt(5 + 1e-6)
        got = self.state_after(m, [-2.0, 1.0, 3.0, 0.0])
        want = [-2 / n * 0.5 * silu(3.0), 1 / n * 0.5 * silu(3.0)]
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, places=14)

    def test_silu_activation_on_keys(self):
        # qk_activation 'silu' without the convolution: k = silu([-2, 1]).
        m = delta_net()
        ks = [silu(-2.0), silu(1.0)]
        n = math.sqrt(ks[0] ** 2 + ks[1] ** 2 + 1e-6)
        got = self.state_after(m, [-2.0, 1.0, 3.0, 0.0])
        for g, kk in zip(got, ks):
            self.assertAlmostEqual(g, kk / n * 0.5 * silu(3.0), places=14)

    def test_elu_then_sum_norm_and_beta_without_projection(self):
        # qk_activation 'elu' (elu(x) + 1), qk_norm 'sum': k = [0, 1] ->
        # [1, 2] -> [1/3, 2/3]; use_beta false: beta = 1, doubled with
        # allow_neg_eigval.
        for neg, beta in ((False, 1.0), (True, 2.0)):
            m = delta_net(qk_activation="elu", qk_norm="sum", use_beta=False,
                          allow_neg_eigval=neg)
            got = self.state_after(m, [0.0, 1.0, 3.0, 0.0])
            for g, kk in zip(got, [1 / 3, 2 / 3]):
                self.assertAlmostEqual(g, kk * beta * silu(3.0), places=14)

    def test_prefill_equals_token_by_token(self):
        assert_prefill_equals_steps(
            self, {"model_type": "delta_net", "hidden_size": 16, "num_hidden_layers": 2,
                   "num_heads": 2, "vocab_size": 20, "use_gate": True})


def gla(**over):
    # hidden 4, key_dim 2 (one key channel pair per head with 1 head), every
    # weight 0 but the norm's.
    c = {"model_type": "gla", "hidden_size": 4, "num_hidden_layers": 1, "num_heads": 1,
         "expand_k": 0.5, "expand_v": 0.25, "vocab_size": 8}
    c.update(over)
    m = ref.GatedLinearAttention(ref.Config(c)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1)
    return m


class GlaTest(unittest.TestCase):
    def run_one(self, m, x, s0):
        _, state = m.run(t([[x]]), (s0,))
        return state[0]

    def test_gate_is_logsigmoid_over_16_per_key_row_then_clamped(self):
        # gk = logsigmoid(0) / 16 = ln(1/2) / 16 on key channel 0; channel 1's
        # bias -1e4 gives logsigmoid = -1e4 in double, a factor exp(-625):
        # the gate scales S's rows (the key dimension). With clamp_min -0.01 the
        # first gate becomes -0.01 and the second too.
        m = gla()
        with torch.no_grad():
            m.gk_proj[1].bias.copy_(t([0.0, -1e4]))
        s = self.run_one(m, [0.0] * 4, torch.ones(1, 1, 2, 1, dtype=torch.float64))
        self.assertAlmostEqual(s[0, 0, 0, 0].item(), 0.5 ** (1 / 16), places=15)
        self.assertAlmostEqual(s[0, 0, 1, 0].item() / math.exp(-625.0), 1.0, places=13)
        m = gla(clamp_min=-0.01)
        with torch.no_grad():
            m.gk_proj[1].bias.copy_(t([0.0, -1e4]))
        s = self.run_one(m, [0.0] * 4, torch.ones(1, 1, 2, 1, dtype=torch.float64))
        for r in range(2):
            self.assertAlmostEqual(s[0, 0, r, 0].item(), math.exp(-0.01), places=15)

    def test_feature_map_on_keys_and_raw_values_without_convolution(self):
        # feature_map relu: k = relu([-1, 2]) = [0, 2]; v = x[2] = 3 with no
        # activation; gates exp(ln(1/2)/16) on an empty state change nothing:
        # S = k v^T = [0, 6].
        m = gla(feature_map="relu")
        with torch.no_grad():
            m.k_proj.weight[0, 0] = 1
            m.k_proj.weight[1, 1] = 1
            m.v_proj.weight[0, 2] = 1
        s = self.run_one(m, [-1.0, 2.0, 3.0, 0.0], torch.zeros(1, 1, 2, 1, dtype=torch.float64))
        self.assertEqual(s.flatten().tolist(), [0.0, 6.0])

    def test_query_head_j_reads_key_value_head_j_div_groups(self):
        # num_heads 4, num_kv_heads 2: heads 0, 1 read kv head 0, heads 2, 3
        # kv head 1, whose keys are 0: only heads 0 and 1 write.
        m = gla(num_heads=4, num_kv_heads=2, expand_k=2, expand_v=1)
        with torch.no_grad():
            m.k_proj.weight[0:2, 0:2] = torch.eye(2, dtype=torch.float64)
            m.v_proj.weight.fill_(1)
        s = self.run_one(m, [1.0, 2.0, 3.0, 4.0], torch.zeros(1, 4, 2, 1, dtype=torch.float64))
        written = [bool(s[0, h].abs().sum() > 0) for h in range(4)]
        self.assertEqual(written, [True, True, False, False])

    def test_output_is_scaled_query_times_state(self):
        # One token, no gate output, no affine norm: S = k v^T with k = [1, 0],
        # v = 2; q = [3, 0] scaled by 2^-1/2: o = 3 * 2 / sqrt 2, and the
        # per-head RMSNorm of a single value o is o / sqrt(o^2 + 1e-6).
        m = gla(use_output_gate=False, elementwise_affine=False)
        with torch.no_grad():
            m.q_proj.weight[0, 0] = 1
            m.k_proj.weight[0, 1] = 1
            m.v_proj.weight[0, 2] = 1
            m.o_proj.weight.fill_(1)
        out, _ = m.run(t([[[3.0, 1.0, 2.0, 0.0]]]), m.new_state(1, torch.float64))
        o = 3 * 2 / math.sqrt(2)
        self.assertAlmostEqual(out[0, 0, 0].item(), o / math.sqrt(o * o + 1e-6), places=14)

    def test_prefill_equals_token_by_token(self):
        assert_prefill_equals_steps(
            self, {"model_type": "gla", "hidden_size": 16, "num_hidden_layers": 2,
                   "num_heads": 4, "num_kv_heads": 2, "use_short_conv": True,
                   "feature_map": "relu", "vocab_size": 20})


class RetNetTest(unittest.TestCase):
    def test_decays_are_float32_log_of_one_minus_two_to_minus_5_minus_h(self):
        # gamma_h = 1 - 2^(-5-h), exact in float32 up to h = 18; its log is
        # taken in float32. From h = 20 on 1 - 2^-25 rounds to 1: no decay.
        g = ref.retention_log_decays(21)
        self.assertEqual(g.dtype, torch.float32)
        for h in (0, 1, 7):
            want = math.log(1 - 2.0 ** (-5 - h))
            self.assertLess(abs(g[h].item() - want), 2 ** -23 * abs(want) + 1e-12)
        self.assertEqual(g[20].item(), 0.0)

    def test_rotary_halves_at_absolute_positions(self):
        # d = 4: inv_freq = [1, 10000^(-1/2)] = [1, 0.01]. x = [1, 0, 0, 0] at
        # position 1: x1 = [1, 0], x2 = [0, 0] ->
        # [x1 cos - x2 sin, x2 cos + x1 sin] = [cos 1, 0, sin 1, 0].
        # x = [0, 1, 0, 0] at position 3 uses the second frequency:
        # [0, cos 0.03, 0, sin 0.03].
        x = t([[[[1, 0, 0, 0]]]])
        got = ref.rotary(x, 1).flatten().tolist()
        for g, w in zip(got, [math.cos(1), 0, math.sin(1), 0]):
            self.assertAlmostEqual(g, w, places=6)  # float32 tables
        got = ref.rotary(t([[[[0, 1, 0, 0]]]]), 3).flatten().tolist()
        for g, w in zip(got, [0, math.cos(0.03), 0, math.sin(0.03)]):
            self.assertAlmostEqual(g, w, places=6)

    def test_state_decays_by_gamma_h_per_head(self):
        # Zero projections (k = v = 0): S = gamma_h S0 per token.
        c = {"model_type": "retnet", "hidden_size": 4, "num_hidden_layers": 1,
             "num_heads": 2, "expand_k": 1, "expand_v": 0.5, "vocab_size": 8}
        m = ref.MultiScaleRetention(ref.Config(c)).double()
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
        s0 = torch.ones(1, 2, 2, 1, dtype=torch.float64)
        _, (s, position) = m.run(torch.zeros(1, 2, 4, dtype=torch.float64), (s0, 5))
        self.assertEqual(position, 7)
        for h in range(2):
            gamma = float(torch.tensor(1 - 2.0 ** (-5 - h), dtype=torch.float32).log().exp())
            self.assertAlmostEqual(s[0, h, 0, 0].item(), gamma ** 2, places=7)

    def test_prefill_equals_token_by_token(self):
        assert_prefill_equals_steps(
            self, {"model_type": "retnet", "hidden_size": 16, "num_hidden_layers": 2,
                   "num_heads": 4, "num_kv_heads": 2, "vocab_size": 20})


def mamba2(**over):
    # hidden 2, expand 2 -> I = 4, head_dim 2 -> 2 heads, state_size 1,
    # conv taps passing the current input (weight 1 on the last tap), every
    # other weight 0 (dt_bias 0 -> dt = softplus(0) = ln 2; A_log 0 -> A = -1).
    c = {"model_type": "mamba2", "hidden_size": 2, "num_hidden_layers": 1, "expand": 2,
         "head_dim": 2, "state_size": 1, "n_groups": 1, "conv_kernel": 2,
         "vocab_size": 8, "rmsnorm": False}
    c.update(over)
    m = ref.Mamba2Mixer(ref.Config(c)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.conv1d.weight[:, 0, -1] = 1
    return m


class Mamba2Test(unittest.TestCase):
    def test_config_reads_infinity_and_older_names(self):
        # fla and transformers write dt_limit as [0.0, Infinity] (not strict
        # JSON); older fla wrote time_step_limit, rms_norm, layer_norm_epsilon.
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write('{"model_type": "mamba2", "hidden_size": 8, "head_dim": 4,'
                        ' "dt_limit": [0.0, Infinity]}')
            c = ref.load_config(d)
        self.assertEqual(c.dt_limit, (0.0, math.inf))
        self.assertEqual((c.num_heads, c.intermediate_size, c.norm_eps), (4, 16, 1e-5))
        c = ref.Config({"model_type": "mamba2", "hidden_size": 8, "head_dim": 4,
                        "time_step_limit": [0.0, 0.5], "rms_norm": True,
                        "layer_norm_epsilon": 1e-3})
        self.assertEqual((c.dt_limit, c.rmsnorm, c.norm_eps), ((0.0, 0.5), True, 1e-3))
        # fla normed whatever rms_norm said for most of its releases, but not
        # in its first: refused rather than guessed.
        with self.assertRaises(ValueError):
            ref.Config({"model_type": "mamba2", "hidden_size": 8, "head_dim": 4,
                        "rms_norm": False})

    def test_one_step_by_hand_and_the_dt_clamp(self):
        # in_proj rows: [z (4) | x (4) B (1) C (1) | dt (2)]. Input u = [a, b]
        # gives x_0 = a (head 0, p = 0) and B = b through the convolution's
        # last tap and SiLU; S_0 = 2 everywhere; dt = ln 2 (0.1 once clamped
        # by dt_limit), A = -1:
        #   S = exp(-dt) * 2 + dt * silu(a) * silu(b) at head 0, p = 0,
        #   exp(-dt) * 2 where x is 0.
        for limit, dt in (((0.0, math.inf), math.log(2)), ((0.0, 0.1), 0.1)):
            m = mamba2(dt_limit=list(limit))
            with torch.no_grad():
                m.in_proj.weight[4, 0] = 1  # x_0 <- a
                m.in_proj.weight[8, 1] = 1  # B <- b
            a, b = 1.5, -0.5
            s0 = torch.full((1, 2, 2, 1), 2.0, dtype=torch.float64)
            cache = m.new_state(1, torch.float64)[1]
            _, (s, _) = m.run(t([[[a, b]]]), (s0, cache))
            want = math.exp(-dt) * 2 + dt * silu(a) * silu(b)
            self.assertAlmostEqual(s[0, 0, 0, 0].item(), want, places=14)
            self.assertAlmostEqual(s[0, 0, 1, 0].item(), math.exp(-dt) * 2, places=14)

    def test_heads_read_group_h_div_heads_per_group(self):
        # 2 heads, 2 groups would be trivial: 4 heads (head_dim 1), 2 groups:
        # heads 0, 1 read group 0, heads 2, 3 group 1 (mamba_ssm and fla's
        # decode; fla's CPU prefill tiles, h % G). Group 1's B is 0: heads 2
        # and 3 only decay.
        m = mamba2(head_dim=1, n_groups=2)
        with torch.no_grad():
            m.in_proj.weight[4:8, 0] = 1  # x of every head <- a
            m.in_proj.weight[8, 1] = 1    # B of group 0 <- b; group 1's stays 0
        s0 = torch.zeros(1, 4, 1, 1, dtype=torch.float64)
        cache = m.new_state(1, torch.float64)[1]
        _, (s, _) = m.run(t([[[1.0, 1.0]]]), (s0, cache))
        written = [bool(s[0, h].abs().sum() > 0) for h in range(4)]
        self.assertEqual(written, [True, True, False, False])

    def test_gated_norm_groups_and_order(self):
        # I = 4, 2 groups of 2 channels, weight 1, eps 1e-5: norm_before_gate
        # false normalises y * silu(z) per group; true normalises y and gates.
        y = t([[[1.0, 3.0, 2.0, 2.0]]])
        z = t([[[0.5, 0.5, -1.0, 2.0]]])
        for before in (False, True):
            m = mamba2(rmsnorm=True, n_groups=2, norm_before_gate=before)
            with torch.no_grad():
                m.norm.weight.fill_(1)
            got = m.gated_norm(y, z).flatten().tolist()
            ys, zs = [1.0, 3.0, 2.0, 2.0], [0.5, 0.5, -1.0, 2.0]
            gated = [a * silu(b) for a, b in zip(ys, zs)]
            src = ys if before else gated
            want = []
            for g in range(2):
                part = src[2 * g:2 * g + 2]
                r = 1 / math.sqrt(sum(v * v for v in part) / 2 + 1e-5)
                want += [v * r for v in part]
            if before:
                want = [w * silu(b) for w, b in zip(want, zs)]
            for gv, wv in zip(got, want):
                self.assertAlmostEqual(gv, wv, places=14)

    def test_prefill_equals_token_by_token(self):
        assert_prefill_equals_steps(
            self, {"model_type": "mamba2", "hidden_size": 16, "num_hidden_layers": 2,
                   "head_dim": 8, "state_size": 4, "n_groups": 2, "vocab_size": 20})


class LoaderTest(unittest.TestCase):
    def test_config_defaults_and_refusals_as_fla(self):
        # hidden_ratio: RetNet's default 2, but null is 4 (GatedMLP) for all;
        # D = 256: int(256 * 2 * 2/3) = 341 -> 512, int(256 * 4 * 2/3) = 682 -> 768.
        base = {"hidden_size": 256, "num_heads": 4}
        self.assertEqual(ref.Config(dict(base, model_type="retnet")).intermediate_size, 512)
        self.assertEqual(ref.Config(dict(base, model_type="retnet",
                                         hidden_ratio=None)).intermediate_size, 768)
        # elementwise_affine null: no norm weight, as fla's `if elementwise_affine:`.
        self.assertFalse(ref.Config(dict(base, model_type="gla",
                                         elementwise_affine=None)).elementwise_affine)
        for bad in ({"model_type": "gla", "hidden_act": "silu"},
                    {"model_type": "retnet", "hidden_size": 1024, "num_heads": 2}):
            with self.assertRaises(ValueError):
                ref.Config(dict(base, **bad))

    def test_fused_mlp_of_older_checkpoints_is_split(self):
        # Before February 2025 fla saved mlp.gate_proj as [2I, D], the gate's
        # I rows first, and no up_proj.
        cfg = {"model_type": "gated_deltanet", "hidden_size": 8, "num_hidden_layers": 1,
               "num_heads": 2, "head_dim": 4, "expand_v": 1, "vocab_size": 16,
               "intermediate_size": 6}
        model = ref.random_model(cfg, 1)
        with tempfile.TemporaryDirectory() as d:
            ref.save_model(model, d)
            path = os.path.join(d, "model.safetensors")
            tensors = ref.read_safetensors(path)
            gate = tensors.pop("model.layers.0.mlp.gate_proj.weight")
            up = tensors.pop("model.layers.0.mlp.up_proj.weight")
            tensors["model.layers.0.mlp.gate_proj.weight"] = ref.np.concatenate([gate, up])
            ref.write_safetensors(path, tensors)
            loaded = ref.load_model(d)
        toks = torch.tensor([[1, 5, 2]])
        with torch.no_grad():
            self.assertTrue(torch.equal(model(toks), loaded(toks)))


if __name__ == "__main__":
    unittest.main()
