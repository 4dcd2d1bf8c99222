#!/usr/bin/python3
"""linattn_client (clients/python), installed as its README says, against a
real linattn-server.

  /usr/bin/python3 tests/python/client_package_test.py SERVER_BINARY

The outer test (Debian's python3) starts the server (--listen 127.0.0.1:0
--port-file, no HTTP, the built-in model from models/tiny), makes a venv
with --system-site-packages and installs the package offline into it with
`pip install --no-build-isolation --no-deps --no-index` (a copy of
clients/python beside a copy of proto/, so the source tree gets no build
files); the install failing fails the test. It then runs this file again
with the venv's python in isolated mode (`-I`: no PYTHONPATH, no script
directory, so only the installed package can be imported), as

  VENV/bin/python -I client_package_test.py --inside 127.0.0.1:PORT

and that run checks the package: grpcio stays Debian's and no top-level
`linattn` module exists; health; attention sessions against a float64
reference; snapshot/restore, fork, delete on exit, errors; DecodeBatch;
generation (greedy equal to the raw stubs', cancellation by closing the
iterator, stop strings, fork/snapshot/restore). A last outer test imports
the package through PYTHONPATH from `build_protos.py --out DIR`.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"

SERVER = None  # outer: the server binary, from argv
TARGET = None  # inside: the server's address, from argv
SHM_TARGET = None  # inside: a unix-socket server with --shared-memory


# --------------------------------------------------------------------------
# Outer: install the package into a venv, start a server, run the checks.

class ClientPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="linattn_client_package_")
        port_file = os.path.join(cls.work, "port")
        cls.log_path = os.path.join(cls.work, "server.log")
        cls.log = open(cls.log_path, "w")
        cls.server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file, "--http-listen", "none",
             "--model", os.path.join(ROOT, "models", "tiny"), "--log-level", "warn"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        # A second server on a unix socket taking shared-memory tensors.
        cls.shm_target = "unix:" + os.path.join(cls.work, "linattn.sock")
        cls.shm_log_path = os.path.join(cls.work, "shm_server.log")
        cls.shm_log = open(cls.shm_log_path, "w")
        cls.shm_server = subprocess.Popen(
            [SERVER, "--listen", cls.shm_target, "--http-listen", "none", "--model", "none",
             "--shared-memory", "--log-level", "warn"],
            stdout=cls.shm_log, stderr=subprocess.STDOUT)
        try:
            cls.venv_python = cls.install()
            cls.target = f"127.0.0.1:{cls.wait_for_port(port_file)}"
            cls.wait_for_socket(cls.shm_target[len("unix:"):])
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def install(cls):
        """The documented install, from a copy of the sources: the package
        at src/clients/python and the schemas at src/proto, as in the
        repository."""
        src = os.path.join(cls.work, "src")
        shutil.copytree(os.path.join(ROOT, "clients", "python"),
                        os.path.join(src, "clients", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "_proto",
                                                      "__pycache__"))
        shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(src, "proto"))
        venv = os.path.join(cls.work, "venv")
        # pip as the README runs it, whatever this machine's pip settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1")
        env.pop("PYTHONPATH", None)
        env.pop("LINATTN_PROTO_DIR", None)
        for cmd in ([sys.executable, "-m", "venv", "--system-site-packages", venv],
                    [os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
                     "--no-deps", "--no-index", os.path.join(src, "clients", "python")]):
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=120)
            if r.returncode != 0:
                raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}")
        return os.path.join(venv, "bin", "python")

    @classmethod
    def wait_for_port(cls, port_file):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if cls.server.poll() is not None:
                raise RuntimeError(f"the server exited ({cls.server.returncode}); see its log:\n"
                                   + open(cls.log_path).read())
            try:
                with open(port_file) as f:
                    port = int(f.read())
                if port > 0:
                    return port
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("the server did not write its port within 20 s")

    @classmethod
    def wait_for_socket(cls, path):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if cls.shm_server.poll() is not None:
                raise RuntimeError(f"the server exited ({cls.shm_server.returncode}); see its "
                                   "log:\n" + open(cls.shm_log_path).read())
            if os.path.exists(path):
                return
            time.sleep(0.05)
        raise RuntimeError("the server did not create its socket within 20 s")

    @classmethod
    def tearDownClass(cls):
        for server in (cls.server, cls.shm_server):
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        cls.log.close()
        cls.shm_log.close()
        shutil.rmtree(cls.work, ignore_errors=True)

    def clean_env(self):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        return env

    def test_installed_package_against_a_real_server(self):
        r = subprocess.run([self.venv_python, "-I", os.path.abspath(__file__), "--inside",
                            self.target, self.shm_target], cwd=self.work, env=self.clean_env(),
                           timeout=240)
        self.assertEqual(r.returncode, 0, "the checks inside the venv failed (output above)")
        self.assertIsNone(self.server.poll(), "the server exited during the checks")
        self.assertIsNone(self.shm_server.poll(), "the shared-memory server exited")

    def test_tls_client_certificates_and_api_keys(self):
        """The installed Client over TLS with a client certificate (mTLS) and
        an API key, against a second server started with --tls-cert,
        --tls-key, --tls-client-ca and --api-keys (certificates made with
        openssl by tests/tls/make_certs.sh)."""
        import hashlib
        import json
        certs = os.path.join(self.work, "certs")
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tls", "make_certs.sh"), certs],
                       check=True, timeout=60)
        key = "py-" + os.urandom(16).hex()
        keys = os.path.join(self.work, "keys.json")
        with open(keys, "w") as f:
            json.dump({"keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest(),
                                 "tenant": "python"}]}, f)
        port_file = os.path.join(self.work, "tls_port")
        log = open(os.path.join(self.work, "tls_server.log"), "w")
        server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file, "--http-listen", "none",
             "--model", "none", "--log-level", "warn", "--api-keys", keys,
             "--tls-cert", os.path.join(certs, "server.pem"),
             "--tls-key", os.path.join(certs, "server.key"),
             "--tls-client-ca", os.path.join(certs, "ca.pem")],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            def port_text():
                try:
                    with open(port_file) as f:
                        return f.read().strip()
                except OSError:
                    return ""
            while not port_text():
                self.assertIsNone(server.poll(), "the TLS server exited")
                self.assertLess(time.monotonic(), deadline, "the TLS server did not start")
                time.sleep(0.05)
            target = f"127.0.0.1:{int(port_text())}"
            c = {n: os.path.join(certs, n) for n in os.listdir(certs)}
            script = f"""
import linattn_client, numpy as np
mtls = dict(tls_ca={c['ca.pem']!r}, tls_cert={c['client.pem']!r}, tls_key={c['client.key']!r})
with linattn_client.Client({target!r}, timeout=20, api_key={key!r}, **mtls) as client:
    with client.create_session(num_heads=1, key_dim=2, value_dim=2) as s:
        out = s.decode(np.ones((1, 2), np.float32), np.ones((1, 2), np.float32),
                       np.ones((1, 2), np.float32))
        assert s.info().position == 1
        assert [x.id for x in client.list_sessions()] == [s.id]
def refused(error, **kw):
    try:
        with linattn_client.Client({target!r}, timeout=20, **kw) as client:
            client.list_sessions()
    except error:
        return True
    return False
assert refused(linattn_client.Unauthenticated, **mtls), "a call without a key was served"
assert refused(linattn_client.Unauthenticated, api_key="wrong", **mtls)
assert refused(linattn_client.Unavailable, api_key={key!r}, tls_ca={c['ca.pem']!r})
assert refused(linattn_client.Unavailable, api_key={key!r}, tls_ca={c['ca.pem']!r},
               tls_cert={c['rogue.pem']!r}, tls_key={c['rogue.key']!r})
assert refused(linattn_client.Unavailable, api_key={key!r})
print("tls ok")
"""
            r = subprocess.run([self.venv_python, "-I", "-c", script], cwd=self.work,
                               env=self.clean_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
            self.assertEqual((r.returncode, r.stdout.strip().splitlines()[-1:]),
                             (0, ["tls ok"]), r.stdout)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=15)
            log.close()

    def test_pythonpath_copy_from_the_build_step(self):
        out = os.path.join(self.work, "pythonpath")
        r = subprocess.run([sys.executable, os.path.join(self.work, "src", "clients", "python",
                                                         "build_protos.py"), "--out", out],
                           env=self.clean_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout)
        script = (
            "import grpc, linattn_client, sys\n"
            f"assert linattn_client.__file__.startswith({out!r}), linattn_client.__file__\n"
            f"assert grpc.__file__.startswith({DEBIAN_DIST_PACKAGES + '/'!r}), grpc.__file__\n"
            f"with linattn_client.Client({self.target!r}, timeout=10) as c:\n"
            "    print(c.health())\n")
        r = subprocess.run([sys.executable, "-c", script], cwd=self.work,
                           env=dict(self.clean_env(), PYTHONPATH=out), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stdout)


# --------------------------------------------------------------------------
# Inside the venv: the checks, against TARGET.

U = 2.0 ** -24  # fp32 unit roundoff


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def reference(q, k, v, eps):
    """Normalised causal linear attention with φ = elu+1, in float64, of
    float32 inputs (T, H, d): y, φ(q)ᵀz, Σ_j w_tj|v_j| and the final S and z
    (with Σ|φ(k)v|, the scale of S's rounding)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    fq, fk = elu1(q), elu1(k)
    S = np.cumsum(fk[..., :, None] * v[..., None, :], axis=0)           # (T, H, dφ, dv)
    S_abs = np.cumsum(fk[..., :, None] * np.abs(v)[..., None, :], axis=0)
    z = np.cumsum(fk, axis=0)                                          # (T, H, dφ)
    numerator = np.einsum("thd,thde->the", fq, S)
    denominator = np.einsum("thd,thd->th", fq, z)
    numerator_abs = np.einsum("thd,thde->the", fq, S_abs)
    y = numerator / (denominator + eps)[..., None]
    return y, denominator, numerator_abs, S[-1], z[-1], S_abs[-1]


def relative_error(tokens, d_phi):
    """The fp32 error bound of tests/attention/test_util.h, per position
    (u = 2⁻²⁴, n = t + 1 tokens summed):

        e_t = (8 + 3n + 2d_φ + 16)·u

    8u for the feature maps (φ(q), φ(k) within 2 ulp each), 2d_φ·u for the
    d_φ-long dot products, 2n·u for a decay applied once per token, n·u for
    any order of summing n terms (decode's recurrence or prefill's chunked
    matmuls), 16u of slack: a few ulps per token of context, relative to
    the sums of absolute values. Then |ΔD| ≤ e·D + u·D (φ > 0, so D is its
    own sum of |terms|) and |Δy| ≤ e·(Σ|w||v| + |y|·D) / (D + ε − e·D) + 2u|y|.
    """
    n = np.arange(1, tokens + 1, dtype=np.float64)
    return (8 + 3 * n + 2 * d_phi + 16) * U


class InsideTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = linattn_client.Client(TARGET, timeout=60)
        cls.rng = np.random.default_rng(20260501)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def random(self, *shape):
        return self.rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)

    def assert_within(self, got, want, bound, what):
        got = np.asarray(got, dtype=np.float64)
        self.assertEqual(got.shape, np.shape(want), what)
        bad = ~(np.abs(got - want) <= bound)
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            self.fail(f"{what}: {int(bad.sum())} of {bad.size} values outside the fp32 bound; "
                      f"first at {i}: {got[i]!r} vs reference {want[i]!r} "
                      f"(|diff| {abs(got[i] - want[i]):.3g} > bound {bound[i]:.3g})")

    def assert_matches_reference(self, outputs, q, k, v, eps, what, first=0):
        """outputs (T − first, H, dv) and denominators (T − first, H) of tokens
        first … T−1 of the sequence q, k, v (T, H, d) against the float64
        reference, within relative_error."""
        y, den, num_abs, _, _, _ = reference(q, k, v, eps)
        e = relative_error(q.shape[0], q.shape[2])[:, None]
        y, den, num_abs, e = y[first:], den[first:], num_abs[first:], e[first:]
        output, denominator = outputs
        self.assert_within(denominator, den, e * den + U * den, f"{what}: denominator")
        margin = den + eps - e * den
        bound = (e[..., None] * (num_abs + np.abs(y) * den[..., None]) / margin[..., None]
                 + 2 * U * np.abs(y))
        self.assert_within(output, y, bound, f"{what}: output")


class Packaging(InsideTest):
    def test_grpcio_is_debians_and_nothing_is_shadowed(self):
        self.assertTrue(os.path.realpath(grpc.__file__).startswith(DEBIAN_DIST_PACKAGES + "/"),
                        grpc.__file__)
        self.assertTrue(hasattr(grpc, "insecure_channel"))
        # The installed copy, not the sources.
        self.assertTrue(linattn_client.__file__.startswith(sys.prefix), linattn_client.__file__)
        self.assertNotEqual(sys.prefix, sys.base_prefix, "not running in the venv")
        for name in ("linattn", "grpc_health"):
            self.assertIsNone(importlib.util.find_spec(name), f"a top-level {name!r} module")
            self.assertNotIn(name, sys.modules)
        generated = [m for m in sys.modules if m.endswith(("_pb2", "_pb2_grpc"))]
        self.assertTrue(generated)
        for m in generated:
            self.assertTrue(m.startswith("linattn_client._proto."), m)
        # Their descriptors are the package's own, not protobuf's default pool.
        from google.protobuf import descriptor_pool
        with self.assertRaises(KeyError):
            descriptor_pool.Default().FindMessageTypeByName("linattn.v1.Session")


class Health(InsideTest):
    def test_serving(self):
        for service in ("", "linattn.v1.AttentionService", "linattn.v1.GenerationService"):
            self.assertEqual(self.client.health(service), "SERVING", service)
            self.assertIs(self.client.health(service), linattn_client.HealthStatus.SERVING)
        self.assertTrue(self.client.is_serving())
        self.assertEqual(self.client.health("no.such.Service"), "SERVICE_UNKNOWN")
        with linattn_client.Client("127.0.0.1:1", timeout=2) as nobody:
            self.assertFalse(nobody.is_serving())
            with self.assertRaises(linattn_client.Unavailable) as e:
                nobody.health()
            self.assertIsInstance(e.exception, grpc.RpcError)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)


class Attention(InsideTest):
    H, DK, DV = 4, 16, 8

    def session(self, **spec):
        fields = dict(num_heads=self.H, key_dim=self.DK, value_dim=self.DV)
        fields.update(spec)
        return self.client.create_session(**fields)

    def tokens(self, T, H=None, dk=None, dv=None):
        H, dk, dv = H or self.H, dk or self.DK, dv or self.DV
        return self.random(T, H, dk), self.random(T, H, dk), self.random(T, H, dv)

    def test_decode_and_prefill_equal_the_float64_reference(self):
        T, P = 48, 20
        q, k, v = self.tokens(T)
        with self.session() as s:
            self.assertEqual(s.spec.feature_map, "elu1")
            self.assertEqual(s.feature_dim, self.DK)
            eps = s.spec.epsilon
            self.assertIsNotNone(eps)  # the server's default, reported back
            first = s.prefill(q[:P], k[:P], v[:P])
            middle = s.decode(q[P:T - 1], k[P:T - 1], v[P:T - 1])
            last = s.decode(q[T - 1], k[T - 1], v[T - 1])
            self.assertEqual(first.output.shape, (P, self.H, self.DV))
            self.assertEqual(middle.output.shape, (T - 1 - P, self.H, self.DV))
            self.assertEqual(last.output.shape, (self.H, self.DV))
            self.assertEqual(last.denominator.shape, (self.H,))
            self.assertEqual((first.position, middle.position, last.position), (P, T - 1, T))
            self.assertEqual(s.position, T)
            self.assertEqual(s.info().position, T)
            for part in (first, middle, last):
                self.assertEqual(part.output.dtype, np.float32)
                self.assertTrue(part.available.all())
            output = np.concatenate([first.output, middle.output, last.output[None]])
            denominator = np.concatenate([first.denominator, middle.denominator,
                                          last.denominator[None]])
            self.assert_matches_reference((output, denominator), q, k, v, eps, "prefill + decode")

            state = s.inspect()
            _, _, _, S, z, S_abs = reference(q, k, v, eps)
            self.assertEqual(state.position, T)
            self.assertIsNone(state.key_log_scale)
            e = relative_error(T, self.DK)[-1]
            self.assert_within(state.s, S, e * S_abs, "S")
            self.assert_within(state.z, z, e * z, "z")

    def test_the_gated_delta_rule_decodes_prefills_and_batches(self):
        # The rule in float64 from fla's naive_recurrent_gated_delta_rule,
        # with fla's l2norm: h = h·e^g; v' = β(v − hᵀk); h += k v'ᵀ; o = hᵀq.
        T, P = 30, 12
        q, k, v = self.tokens(T)
        rng = np.random.default_rng(5)
        g = (-0.2 * rng.random((T, self.H))).astype(np.float32)
        beta = rng.random((T, self.H)).astype(np.float32)

        def l2(x):
            x = x.astype(np.float64)
            return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
        qn, kn = l2(q), l2(k)
        h = np.zeros((self.H, self.DK, self.DV))
        want = np.zeros((T, self.H, self.DV))
        # The forward error bound of tests/attention/rule_bounds.h: keys of
        # norm 1, β ≤ 1 and α ≤ 1 grow no error, each step adds at most
        # u·κ·(2‖S‖ + β‖v‖) to ‖ΔS‖ (κ = 4(d_k + C) + 16 + 4·Σ|g| over a
        # chunk), and the read-out adds (2d_k + 8)·u·‖S‖ (‖q‖ ≤ 1).
        u, C = 2.0 ** -24, 64
        err, bound = np.zeros(self.H), np.zeros((T, self.H))
        for t in range(T):
            norm_before = np.sqrt((h * h).sum(axis=(1, 2)))
            h *= np.exp(g[t].astype(np.float64))[:, None, None]
            uk = np.einsum("hkv,hk->hv", h, kn[t])
            e = (v[t] - uk) * beta[t][:, None]
            h += kn[t][:, :, None] * e[:, None, :]
            want[t] = np.einsum("hkv,hk->hv", h, qn[t])
            kappa = 4 * (self.DK + C) + 16 + 4 * np.abs(g[max(0, t - C + 1):t + 1]).sum(0)
            err += u * kappa * (2 * norm_before + beta[t] * np.linalg.norm(v[t], axis=-1))
            bound[t] = err + (2 * self.DK + 8) * u * np.sqrt((h * h).sum(axis=(1, 2)))
        with self.session(rule="gated_delta", qk_l2norm=True) as s:
            self.assertEqual(s.spec.rule, "gated_delta")
            self.assertEqual(s.spec.feature_map, "identity")
            self.assertTrue(s.spec.unnormalized)
            first = s.prefill(q[:P], k[:P], v[:P], g=g[:P], beta=beta[:P])
            rest = s.decode(q[P:], k[P:], v[P:], g=g[P:], beta=beta[P:])
            got = np.concatenate([first.output, rest.output])
            self.assertTrue((np.abs(got - want) <= bound[:, :, None]).all(),
                            np.abs(got - want).max())
            state = s.inspect()
            self.assertIsNone(state.z)
            self.assertEqual(state.s.shape, (self.H, self.DK, self.DV))
            self.assertTrue(np.sqrt(((state.s - h) ** 2).sum(axis=(1, 2)) <= bound[-1]).all())
            with self.assertRaises(linattn_client.InvalidArgument) as bad:
                s.decode(q[0], k[0], v[0], g=np.ones(self.H), beta=beta[0])
            self.assertIn("g[0]", str(bad.exception))
            self.assertEqual(s.info().position, T)
            # One DecodeBatch message over two sessions equals each alone.
            with self.session(rule="gated_delta", qk_l2norm=True) as a, \
                    self.session(rule="gated_delta", qk_l2norm=True) as b, \
                    self.session(rule="gated_delta", qk_l2norm=True) as alone:
                outs = self.client.decode_batch([(a, q[0], k[0], v[0], None, g[0], beta[0]),
                                                 (b, q[1], k[1], v[1], None, g[1], beta[1])])
                one = alone.decode(q[1], k[1], v[1], g=g[1], beta=beta[1])
                np.testing.assert_array_equal(outs[1].output, one.output)
                self.assertEqual((a.position, b.position), (1, 1))

    def test_the_rwkv7_rule_decodes_and_prefills_as_blinkdls_time_mix(self):
        # RWKV-7's state in BlinkDL's own layout (RWKV-v7/rwkv_v7_numpy.py,
        # S indexed (value, key)): S = S * w.mT - S @ kk * (kk*a).mT + v * k.mT;
        # y = S @ r, in float64. The rule takes a = -kk, b = kk * a (fla's
        # form, S indexed (key, value)), and g = log w per key channel.
        T, P, H, N = 30, 12, self.H, self.DK
        r, k, _ = self.tokens(T, dv=N)
        _, _, v = self.tokens(T, dv=N)
        rng = np.random.default_rng(7)
        g = (-np.exp(-0.5) * rng.random((T, H, N))).astype(np.float32)
        kk = rng.standard_normal((T, H, N))
        kk = (kk / np.linalg.norm(kk, axis=-1, keepdims=True)).astype(np.float32)
        lr = rng.random((T, H, N)).astype(np.float32)
        a_in, b_in = -kk, (kk * lr).astype(np.float32)
        S = np.zeros((H, N, N))
        want = np.zeros((T, H, N))
        # The bound of tests/attention/rule_bounds.h for this rule: per token
        # ρ_t ≥ ‖diag(w) + b aᵀ‖₂ (Weyl on its Gram matrix), s_t = ‖S‖(max w +
        # ‖a‖‖b‖) + ‖k‖‖v‖, κ = 4(d_k + C) + 16 + 4·B over the chunk;
        # windows of 16 tokens carry earlier errors through the Frobenius
        # norm of their transitions' product.
        u, C = 2.0 ** -24, 64
        bound, snorm = np.zeros((T, H)), np.zeros((T, H))
        carried = delta = np.zeros(H)
        M = np.zeros((H, N, N))
        gsum = np.zeros(H)
        for t in range(T):
            w = np.exp(g[t].astype(np.float64))
            a64, b64 = a_in[t].astype(np.float64), b_in[t].astype(np.float64)
            c = w * b64
            a2, b2 = (a64 * a64).sum(-1), (b64 * b64).sum(-1)
            ac, cc = (a64 * c).sum(-1), (c * c).sum(-1)
            tr, det = b2 * a2 + 2 * ac, ac * ac - a2 * cc
            w_max = tr / 2 + np.sqrt(np.maximum(0, tr * tr / 4 - det))
            rho = np.sqrt(w.max(-1) ** 2 + np.maximum(0, w_max))
            step = np.sqrt((S * S).sum(axis=(1, 2))) * (w.max(-1) + np.sqrt(a2 * b2)) + \
                np.linalg.norm(k[t], axis=-1) * np.linalg.norm(v[t], axis=-1)
            gsum = gsum + np.abs(g[t]).max(-1) - (np.abs(g[t - C]).max(-1) if t >= C else 0)
            if t % 16 == 0:
                carried, delta = (bound[t - 1] if t else np.zeros(H)), np.zeros(H)
                M = np.broadcast_to(np.eye(N), (H, N, N)).copy()
            M = w[:, :, None] * M + b64[:, :, None] * np.einsum("hm,hmj->hj", a64, M)[:, None, :]
            delta = rho * delta + u * (4 * (N + C) + 16 + 4 * gsum) * step
            bound[t] = np.sqrt((M * M).sum(axis=(1, 2))) * carried + delta
            Sk = np.einsum("hxm,hm->hx", S, kk[t])
            S = S * w[:, None, :] - Sk[:, :, None] * (kk[t] * lr[t])[:, None, :] + \
                v[t][:, :, None].astype(np.float64) * k[t][:, None, :]
            want[t] = np.einsum("hxj,hj->hx", S, r[t])
            snorm[t] = np.sqrt((S * S).sum(axis=(1, 2)))
        with self.session(rule="rwkv7", value_dim=N) as s:
            self.assertEqual((s.spec.rule, s.spec.gate), ("rwkv7", "key"))
            first = s.prefill(r[:P], k[:P], v[:P], g=g[:P], a=a_in[:P], b=b_in[:P])
            rest = s.decode(r[P:], k[P:], v[P:], g=g[P:], a=a_in[P:], b=b_in[P:])
            got = np.concatenate([first.output, rest.output])
            # |Δo| ≤ ‖r‖(Δ_t + (2d_k + 8)u‖S_t‖) + 2u|o|
            tol = np.linalg.norm(r, axis=-1) * (bound + (2 * N + 8) * u * snorm)
            self.assertTrue((np.abs(got - want) <= tol[:, :, None] + 2 * u * np.abs(want)).all(),
                            np.abs(got - want).max())
            state = s.inspect()
            self.assertTrue(np.abs(state.s - S.transpose(0, 2, 1)).max() <= bound[-1].max())
            with self.assertRaises(linattn_client.InvalidArgument) as bad:
                s.decode(r[0], k[0], v[0], g=g[0], a=a_in[0])
            self.assertIn("b: expected", str(bad.exception))
            self.assertEqual(s.info().position, T)

    def test_the_rwkv6_rule_decodes_and_prefills_as_blinkdls_time_mix(self):
        # RWKV-6's state as BlinkDL's demo writes it (RWKV-v5/rwkv_v6_demo.py,
        # time_mixing; s indexed (key, value)): a = k @ v;
        # x = r @ (time_first * a + s); s = a + w * s, in float64, with
        # w = exp(-exp(w_raw)) per key channel (the rule takes g = log w) and
        # time_first = u, the spec's bonus.
        T, P, H, N = 30, 12, self.H, self.DK
        r, k, v = self.tokens(T)
        rng = np.random.default_rng(8)
        g = (-np.exp(rng.uniform(-3.0, 1.0, (T, H, N)))).astype(np.float32)
        u = rng.uniform(-1.0, 1.0, (H, N)).astype(np.float32)
        s64 = np.zeros((H, N, self.DV))
        # What each output's rounding is relative to (the gated rule's bound
        # of tests/attention/rule_bounds.h): N_abs = Σ|terms|, N_gate the
        # same with each term times the log-gate span it crossed.
        s_abs, s_gate = np.zeros_like(s64), np.zeros_like(s64)
        want, n_abs, n_gate = (np.zeros((T, H, self.DV)) for _ in range(3))
        for t in range(T):
            w = np.exp(g[t].astype(np.float64))[:, :, None]
            a = k[t].astype(np.float64)[:, :, None] * v[t].astype(np.float64)[:, None, :]
            own = u.astype(np.float64)[:, :, None] * a
            want[t] = np.einsum("hk,hkv->hv", r[t], own + s64)
            n_abs[t] = np.einsum("hk,hkv->hv", np.abs(r[t]), np.abs(own) + s_abs)
            n_gate[t] = np.einsum("hk,hkv->hv", np.abs(r[t]), s_gate)
            s64 = a + w * s64
            s_gate = w * (s_gate + np.abs(g[t])[:, :, None] * s_abs)
            s_abs = np.abs(a) + w * s_abs
        unit, C, tau = 2.0 ** -24, 64, 8
        tol = unit * ((4 * np.arange(1, T + 1)[:, None, None] + 2 * N + 2 * C + 32 +
                       2 * tau + 3 + 4) * n_abs + 4 * n_gate) + 2 * unit * np.abs(want)
        with self.session(rule="rwkv6", bonus=u) as s:
            self.assertEqual((s.spec.rule, s.spec.gate), ("rwkv6", "key"))
            np.testing.assert_array_equal(np.asarray(s.spec.bonus, np.float32), u.reshape(-1))
            first = s.prefill(r[:P], k[:P], v[:P], g=g[:P])
            rest = s.decode(r[P:], k[P:], v[P:], g=g[P:])
            got = np.concatenate([first.output, rest.output])
            self.assertTrue((np.abs(got - want) <= tol).all(), np.abs(got - want).max())
            with self.assertRaises(linattn_client.InvalidArgument) as bad:
                s.decode(r[0], k[0], v[0], g=g[0], a=g[0])
            self.assertIn("rule rwkv6 takes no a", str(bad.exception))
            self.assertEqual(s.info().position, T)
        with self.assertRaises(linattn_client.InvalidArgument) as bad:
            self.session(rule="rwkv6")
        self.assertIn("spec.bonus", str(bad.exception))

    def test_a_kept_decode_stream(self):
        T = 6
        q, k, v = self.tokens(T)
        with self.session() as s:
            with s.decoder() as d:
                steps = [d.decode(q[t], k[t], v[t]) for t in range(T)]
            self.assertEqual([r.position for r in steps], list(range(1, T + 1)))
            self.assert_matches_reference(
                (np.stack([r.output for r in steps]), np.stack([r.denominator for r in steps])),
                q, k, v, s.spec.epsilon, "Decoder")

    def test_snapshot_then_restore_gives_identical_state(self):
        q, k, v = self.tokens(11)
        with self.session(decay=[0.9, 0.95, 1.0, 0.5]) as s:
            s.prefill(q[:10], k[:10], v[:10])
            blob = s.snapshot()
            self.assertIsInstance(blob, bytes)
            before = s.inspect()
            with self.client.restore_session(blob) as r:
                self.assertNotEqual(r.id, s.id)
                self.assertEqual(r.spec, s.spec)
                self.assertEqual(r.position, 10)
                after = r.inspect()
                np.testing.assert_array_equal(after.s, before.s)
                np.testing.assert_array_equal(after.z, before.z)
                self.assertEqual(after.position, before.position)
                # And they go on identically.
                a = s.decode(q[10], k[10], v[10])
                b = r.decode(q[10], k[10], v[10])
                np.testing.assert_array_equal(a.output, b.output)
                np.testing.assert_array_equal(r.inspect().s, s.inspect().s)
            with self.assertRaises(linattn_client.DataLoss) as e:
                self.client.restore_session(blob[:-7])
            self.assertEqual(e.exception.code(), grpc.StatusCode.DATA_LOSS)

    def test_a_fork_branches_independently(self):
        q, k, v = self.tokens(10)
        with self.session() as a:
            a.prefill(q[:8], k[:8], v[:8])
            before = a.inspect()
            with a.fork() as b:
                self.assertNotEqual(b.id, a.id)
                self.assertEqual(b.position, 8)
                np.testing.assert_array_equal(b.inspect().s, before.s)
                b.decode(q[8], k[8], v[8])
                # a did not move.
                np.testing.assert_array_equal(a.inspect().s, before.s)
                np.testing.assert_array_equal(a.inspect().z, before.z)
                self.assertEqual(a.info().position, 8)
                # The same token on a: the two agree again, bit for bit.
                a.decode(q[8], k[8], v[8])
                np.testing.assert_array_equal(a.inspect().s, b.inspect().s)
                # Another token on b only: they part.
                b.decode(q[9], k[9], v[9])
                sa, sb = a.inspect(), b.inspect()
                self.assertEqual((sa.position, sb.position), (9, 10))
                self.assertFalse(np.array_equal(sa.s, sb.s))
            self.assertEqual(a.info().position, 9)  # b's deletion left a alone

    def test_leaving_the_with_block_deletes_the_session(self):
        q, k, v = self.tokens(1)
        with self.session() as s:
            s.decode(q, k, v)
            sid = s.id
            self.assertIn(sid, [x.id for x in self.client.list_sessions()])
        with self.assertRaises(linattn_client.NotFound) as e:
            self.client.session(sid)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn(sid, e.exception.details())
        with self.assertRaises(linattn_client.NotFound):
            s.decode(q, k, v)
        self.assertNotIn(sid, [x.id for x in self.client.list_sessions()])
        s.close()  # gone already: nothing to do

    def test_a_bad_request_raises_invalid_argument_naming_the_field(self):
        with self.assertRaises(linattn_client.InvalidArgument) as e:
            self.session(feature_map="no-such-map")
        self.assertIsInstance(e.exception, grpc.RpcError)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.feature_map", e.exception.details())
        with self.session() as s:
            q, k, v = self.tokens(3)
            s.decode(q[0], k[0], v[0])
            k[1, 2, 5] = np.nan
            with self.assertRaises(linattn_client.InvalidArgument) as e:
                s.prefill(q[1:], k[1:], v[1:])
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertRegex(e.exception.details(), r"^k\[\d+\]")
            self.assertEqual(s.info().position, 1)  # nothing applied
            # Shapes are checked here, naming the field the same way.
            with self.assertRaises(linattn_client.InvalidArgument) as e:
                s.decode(q[0], k[0], v[0, :, :-1])
            self.assertTrue(e.exception.details().startswith("v: "), e.exception.details())
            # A step that must follow another position is refused.
            with self.assertRaises(linattn_client.FailedPrecondition):
                s.decode(q[2], k[2], v[2], expected_position=7)
            self.assertEqual(s.decode(q[2], k[2], v[2], expected_position=1).position, 2)

    def test_decode_batch_steps_several_sessions_at_once(self):
        qa, ka, va = self.tokens(6)
        qb, kb, vb = self.tokens(4, H=2, dk=8, dv=4)
        with self.session() as a, self.client.create_session(num_heads=2, key_dim=8,
                                                             value_dim=4) as b:
            a.prefill(qa[:5], ka[:5], va[:5])
            b.decode(qb[:3], kb[:3], vb[:3])
            # A bad step (steps[1]) fails the whole message.
            with self.assertRaises(linattn_client.InvalidArgument) as e:
                self.client.decode_batch([(a, qa[5], ka[5], va[5]),
                                          (b, qb[3], kb[3] * np.nan, vb[3])])
            self.assertIn("steps[1]", e.exception.details())
            self.assertEqual((a.info().position, b.info().position), (5, 3))
            ra, rb = self.client.decode_batch([(a, qa[5], ka[5], va[5]), (b, qb[3], kb[3], vb[3])])
            self.assertEqual((ra.position, rb.position), (6, 4))
            self.assertEqual((ra.output.shape, rb.output.shape), ((4, 8), (2, 4)))
            for r, (q, k, v), s in ((ra, (qa, ka, va), a), (rb, (qb, kb, vb), b)):
                # The batch's token against the reference over the whole sequence.
                self.assert_matches_reference((r.output[None], r.denominator[None]), q, k, v,
                                              s.spec.epsilon, "DecodeBatch", first=q.shape[0] - 1)


def builtin_tokens(text):
    """The built-in model's tokens for text: its tokenizer.model read with
    Debian's sentencepiece, which encodes as the server does."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(
        model_file=os.path.join(ROOT, "models", "tiny", "tokenizer.model"))
    return sp.encode(text)


class SharedMemory(InsideTest):
    H, DK, DV = 4, 16, 8

    def test_a_prefill_through_shared_memory_gives_the_messages_bits(self):
        T = 300
        q, k, v = self.random(T, self.H, self.DK), self.random(T, self.H, self.DK), \
            self.random(T, self.H, self.DV)
        rng = np.random.default_rng(11)
        g = (-0.2 * rng.random((T, self.H))).astype(np.float32)
        beta = rng.random((T, self.H)).astype(np.float32)
        client = linattn_client.Client(SHM_TARGET, timeout=60)
        try:
            g_key = (-0.2 * rng.random((T, self.H, self.DK))).astype(np.float32)
            ab = (0.2 * self.random(T, self.H, self.DK), 0.2 * self.random(T, self.H, self.DK))
            for rule, extra in (("linear", {}), ("gated_delta", {"g": g, "beta": beta}),
                                ("rwkv7", {"g": g_key, "a": ab[0], "b": ab[1]})):
                spec = dict(num_heads=self.H, key_dim=self.DK, value_dim=self.DV, rule=rule)
                if rule == "gated_delta":
                    spec["qk_l2norm"] = True
                with client.create_session(**spec) as a, client.create_session(**spec) as b:
                    by_message = a.prefill(q, k, v, **extra)
                    by_region = b.prefill(q, k, v, shared_memory=True, **extra)
                    self.assertEqual(by_region.position, T)
                    self.assertEqual(b.position, T)
                    for x, y in ((by_message.output, by_region.output),
                                 (by_message.denominator, by_region.denominator),
                                 (by_message.available, by_region.available)):
                        self.assertEqual(x.shape, y.shape, rule)
                        self.assertEqual(x.tobytes(), y.tobytes(), rule)
                    self.assertEqual(a.inspect().s.tobytes(), b.inspect().s.tobytes(), rule)
                    # One token, as decode's shapes allow.
                    one = b.prefill(q[0], k[0], v[0], shared_memory=True,
                                    **{n: x[0] for n, x in extra.items()})
                    self.assertEqual(one.output.shape, (self.H, self.DV))
                    self.assertEqual(one.position, T + 1)
            # The server reads what the offsets name, so a g of the wrong
            # shape is refused here, before anything is sent.
            with client.create_session(num_heads=self.H, key_dim=self.DK, value_dim=self.DV,
                                       rule="gated", gate="key") as s:
                with self.assertRaises(linattn_client.InvalidArgument) as bad:
                    s.prefill(q[:4], k[:4], v[:4], g=g[:4], shared_memory=True)
                self.assertIn(f"g: rule gated takes log-gates of shape (4, {self.H}, {self.DK})",
                              str(bad.exception))
                self.assertEqual(s.info().position, 0)
        finally:
            client.close()
        # A server without --shared-memory refuses, naming the field.
        with self.client.create_session(num_heads=self.H, key_dim=self.DK,
                                        value_dim=self.DV) as s:
            with self.assertRaises(linattn_client.FailedPrecondition) as refused:
                s.prefill(q[:4], k[:4], v[:4], shared_memory=True)
            self.assertIn("shared_memory", str(refused.exception))
            self.assertEqual(s.info().position, 0)


class Generation(InsideTest):
    PROMPT = "In the beginning God created"

    def test_list_models(self):
        models = self.client.list_models()
        self.assertGreaterEqual(len(models), 1)
        m = models[0]
        self.assertEqual((m.name, m.model_type, m.tokenizer, m.vocab_size),
                         ("tiny", "gated_deltanet", "sentencepiece", 4096))
        self.assertGreater(m.state_bytes, 0)
        with self.client.model_session() as s:
            self.assertEqual(s.model, m.name)
            self.assertEqual(s.state_bytes, m.state_bytes)

    def raw_greedy(self, prompt, n):
        """The same through the generated stubs alone."""
        from linattn_client.proto import generation_pb2 as g
        from linattn_client.proto import generation_pb2_grpc as gg
        stub = gg.GenerationServiceStub(self.client.channel)
        sid = stub.CreateSession(g.CreateModelSessionRequest(), timeout=30).session_id
        try:
            stub.Append(g.AppendRequest(session_id=sid, text=prompt), timeout=30)
            replies = list(stub.Generate(g.GenerateRequest(
                session_id=sid, sampling=g.SamplingParams(max_tokens=n)), timeout=60))
        finally:
            stub.DeleteSession(g.DeleteModelSessionRequest(session_id=sid), timeout=30)
        return [r.token_id for r in replies], "".join(r.text for r in replies)

    def test_greedy_generation_equals_the_raw_stubs_and_repeats(self):
        n = 24
        with self.client.model_session() as s:
            info = s.append(self.PROMPT)
            P = len(builtin_tokens(self.PROMPT))
            self.assertEqual((info.position, s.position), (P, P))
            events = list(s.generate(max_tokens=n))
            self.assertEqual(len(events), n)
            self.assertEqual([e.position for e in events], list(range(P + 1, P + n + 1)))
            self.assertEqual([e.finish_reason for e in events], [None] * (n - 1) + ["length"])
            self.assertTrue(all(e.logprob is None for e in events))
            ids = [e.token_id for e in events]
            text = "".join(e.text for e in events)
            self.assertTrue(text)
            self.assertEqual(self.raw_greedy(self.PROMPT, n), (ids, text))
        # Token ids as the prompt, logprobs, and complete(): the same again.
        with self.client.model_session() as s:
            stream = s.generate(builtin_tokens(self.PROMPT), max_tokens=n, logprobs=True)
            again = list(stream)
            self.assertEqual([e.token_id for e in again], ids)
            self.assertEqual(stream.token_ids, ids)
            self.assertEqual(stream.finish_reason, "length")
            for e in again:
                self.assertTrue(e.logprob is not None and np.isfinite(e.logprob) and e.logprob <= 0,
                                e)
            if stream.usage is not None:
                self.assertEqual(stream.usage.completion_tokens, n)
        with self.client.model_session() as s:
            self.assertEqual(s.complete(self.PROMPT, max_tokens=n), text)

    def test_closing_the_iterator_early_cancels_generation(self):
        prompt, read, most = "And God said", 3, 4000
        P = len(builtin_tokens(prompt))
        with self.client.model_session() as s:
            with s.generate(prompt, max_tokens=most) as stream:
                delivered = [next(stream) for _ in range(read)]
            self.assertEqual([e.position for e in delivered], list(range(P + 1, P + read + 1)))
            # The next request of the session runs after the cancelled one:
            # its first token follows what the cancel kept.
            after = list(s.generate(max_tokens=8))
            kept = after[0].position - 1
            # The server keeps exactly the tokens whose messages it had sent:
            # every delivered one, and possibly one or two that were still on
            # their way when the call was cancelled (so the context may hold
            # more than was delivered); generation stopped long before
            # max_tokens.
            self.assertGreaterEqual(kept, P + read)
            self.assertLess(kept, P + most // 2)
            # The kept tokens are the greedy continuation: a twin that
            # generated exactly that many goes on identically.
            with self.client.model_session() as twin:
                list(twin.generate(prompt, max_tokens=kept - P))
                self.assertEqual(twin.info().position, kept)
                self.assertEqual([e.token_id for e in twin.generate(max_tokens=8)],
                                 [e.token_id for e in after])
            # A `for` loop that breaks drops the stream: that cancels too.
            start = s.info().position
            for i, _ in enumerate(s.generate(max_tokens=most)):
                if i == 1:
                    break
            position = s.append(",").position - len(builtin_tokens(","))
            self.assertGreaterEqual(position, start + 2)
            self.assertLess(position, start + most // 2)

    def test_stop_strings(self):
        # Seeded sampling: reproducible, and more varied than the tiny
        # model's greedy text.
        sampling = dict(max_tokens=48, temperature=0.8, seed=3)
        with self.client.model_session() as s:
            full = s.complete(self.PROMPT, **sampling)
        # A stop string whose first occurrence is well inside the text.
        starts = [i for i in range(8, len(full) - 3) if full.index(full[i:i + 3]) == i]
        self.assertTrue(starts, f"no usable stop string in {full!r}")
        stop = full[starts[0]:starts[0] + 3]
        expected = full[:starts[0]]
        with self.client.model_session() as s:
            stream = s.generate(self.PROMPT, stop=[stop, "#never#"], **sampling)
            text = "".join(e.text for e in stream)
            self.assertEqual(stream.finish_reason, "stop")
        self.assertEqual(text, expected, f"stop {stop!r} in {full!r}")
        with self.client.model_session() as s:  # one string works too
            self.assertEqual(s.complete(self.PROMPT, stop=stop, **sampling), expected)

    def test_fork_snapshot_restore_and_delete(self):
        with self.client.model_session() as s:
            s.append(self.PROMPT)
            with s.fork() as f:
                self.assertNotEqual(f.id, s.id)
                self.assertEqual(f.position, s.position)
                blob = s.snapshot()
                with self.client.restore_model_session(blob) as r:
                    self.assertEqual(r.position, s.position)
                    runs = [[e.token_id for e in x.generate(max_tokens=8)] for x in (s, f, r)]
                    self.assertEqual(runs[0], runs[1])
                    self.assertEqual(runs[0], runs[2])
                f.delete()
                with self.assertRaises(linattn_client.NotFound):
                    f.info()
                with self.assertRaises(linattn_client.NotFound):
                    self.client.get_model_session(f.id)
            with self.assertRaises(linattn_client.DataLoss):
                self.client.restore_model_session(blob[:-3])
            # A model snapshot is not an attention session's.
            with self.assertRaises(linattn_client.InvalidArgument):
                self.client.restore_session(blob)
            sid = s.id
        with self.assertRaises(linattn_client.NotFound):
            list(s.generate(max_tokens=2))
        self.assertNotIn(sid, [x.id for x in self.client.list_model_sessions()])


def inside_main(argv):
    global TARGET, SHM_TARGET
    TARGET, SHM_TARGET = argv[0], argv[1]
    unittest.main(argv=[sys.argv[0], "-v"] + argv[2:], verbosity=2)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--inside":
        import importlib.util

        import grpc
        import numpy as np

        import linattn_client
        del ClientPackageTest  # the outer test is not run inside
        inside_main(sys.argv[2:])
    else:
        SERVER = sys.argv.pop(1)
        for name in ("InsideTest", "Packaging", "Health", "Attention", "SharedMemory",
                     "Generation"):
            del globals()[name]
        unittest.main(verbosity=2)
