#!/usr/bin/python3
"""linattn-server as a standard gRPC client in another language sees it:
Debian's grpcio with Python code generated from every file under proto/.

  python_client_test.py SERVER_BINARY

Checks that the generated code imports without shadowing grpcio, that
health and server reflection describe every service (grpc.health.v1
included), that a model whose bytes are not UTF-8 streams as valid text,
and that a request whose string field is not UTF-8 is refused naming the
field. Starts its own server on 127.0.0.1 with an ephemeral port.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import linattn_ref  # noqa: E402  (its safetensors writer)

SERVER = None  # set from argv
WORK = tempfile.mkdtemp(prefix="linattn_pyclient_")


def compile_protos(out):
    """Every .proto under proto/ (and this test's reflection schema)."""
    plugin = shutil.which("grpc_python_plugin")
    for root, files in ((os.path.join(ROOT, "proto"), None),
                        (os.path.join(HERE, "proto"), None)):
        files = sorted(glob.glob(os.path.join(root, "**", "*.proto"), recursive=True))
        subprocess.run(["protoc", f"-I{root}", f"--python_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={plugin}", *files], check=True)


def write_ff_model(path):
    """A byte model whose greedy token is always 0xFF (never UTF-8): every
    projection zero, embeddings ones, lm_head one-hot on 255."""
    H, L, I, V, heads = 32, 2, 48, 260, 2
    config = {"model_type": "linear_attn", "hidden_size": H, "num_hidden_layers": L,
              "num_heads": heads, "feature_map": "elu", "norm_feature_map": True,
              "intermediate_size": I, "vocab_size": V, "linattn_tokenizer": "bytes", "bos_token_id": None,
              "eos_token_id": None, "tie_word_embeddings": False}
    t = {"model.embeddings.weight": np.ones((V, H)), "model.norm.weight": np.ones(H)}
    for layer in range(L):
        p = f"model.layers.{layer}."
        t[p + "attn_norm.weight"] = np.ones(H)
        t[p + "mlp_norm.weight"] = np.ones(H)
        t[p + "attn.norm.weight"] = np.ones(H // heads)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + "attn." + name + ".weight"] = np.zeros((H, H))
        t[p + "mlp.gate_proj.weight"] = np.zeros((I, H))
        t[p + "mlp.up_proj.weight"] = np.zeros((I, H))
        t[p + "mlp.down_proj.weight"] = np.zeros((H, I))
    head = np.zeros((V, H))
    head[255] = 1
    t["lm_head.weight"] = head
    os.makedirs(path, exist_ok=True)
    import json
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    linattn_ref.write_safetensors(os.path.join(path, "model.safetensors"), t)


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        gen = os.path.join(WORK, "gen")
        os.makedirs(gen)
        compile_protos(gen)
        sys.path.insert(0, gen)
        model = os.path.join(WORK, "ff")
        write_ff_model(model)
        port_file = os.path.join(WORK, "port")
        cls.log = open(os.path.join(WORK, "server.log"), "w")
        cls.server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--http-listen", "none", "--port-file", port_file,
             "--model", model, "--log-level", "warn"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        port = None
        while time.time() < deadline and port is None:
            if cls.server.poll() is not None:
                raise RuntimeError("the server exited")
            try:
                with open(port_file) as f:
                    port = int(f.read())
            except (OSError, ValueError):
                time.sleep(0.05)
        if port is None:
            raise RuntimeError("the server did not start")
        import grpc
        cls.grpc = grpc
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.send_signal(signal.SIGTERM)
        try:
            cls.server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            cls.server.kill()
        cls.log.close()
        shutil.rmtree(WORK, ignore_errors=True)

    def test_generated_code_leaves_grpcio_alone(self):
        import grpc
        from grpc_health.v1 import health_pb2_grpc  # noqa: F401
        from linattn.v1 import attention_pb2_grpc, generation_pb2_grpc  # noqa: F401
        # `grpc` is still Debian's grpcio, not a folder of generated code.
        self.assertNotIn(WORK, os.path.abspath(grpc.__file__))
        self.assertTrue(hasattr(grpc, "insecure_channel"))

    def test_health_says_serving(self):
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", "linattn.v1.AttentionService", "linattn.v1.GenerationService"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, service)

    def test_reflection_describes_every_service(self):
        import reflection_v1alpha_pb2 as pb
        import reflection_v1alpha_pb2_grpc as pb_grpc
        from google.protobuf import descriptor_pb2
        stub = pb_grpc.ServerReflectionStub(self.channel)
        requests = [pb.ServerReflectionRequest(list_services="*")]
        symbols = ["grpc.health.v1.Health", "linattn.v1.AttentionService",
                   "linattn.v1.GenerationService"]
        requests += [pb.ServerReflectionRequest(file_containing_symbol=s) for s in symbols]
        replies = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
        listed = {s.name for s in replies[0].list_services_response.service}
        for s in symbols:
            self.assertIn(s, listed)
        for symbol, reply in zip(symbols, replies[1:]):
            self.assertEqual(reply.WhichOneof("message_response"), "file_descriptor_response",
                             f"{symbol}: {reply.error_response.error_message}")
            names = set()
            for raw in reply.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                names |= {f"{fd.package}.{s.name}" for s in fd.service}
            self.assertIn(symbol, names)

    def test_bytes_that_are_not_utf8_stream_as_valid_text(self):
        from linattn.v1 import generation_pb2 as g
        from linattn.v1 import generation_pb2_grpc as gg
        stub = gg.GenerationServiceStub(self.channel)
        session = stub.CreateSession(g.CreateModelSessionRequest(), timeout=10)
        replies = list(stub.Generate(
            g.GenerateRequest(session_id=session.session_id, prompt="hi",
                              sampling=g.SamplingParams(max_tokens=3)), timeout=20))
        self.assertEqual([r.token_id for r in replies], [255, 255, 255])
        self.assertEqual("".join(r.text for r in replies), "\ufffd" * 3)
        self.assertEqual(replies[-1].finish_reason, "length")

    def test_a_string_field_that_is_not_utf8_is_named(self):
        # Raw bytes, as a client with no UTF-8 check would send them:
        # GetSessionRequest{session_id = b"\xff\xfe"}.
        call = self.channel.unary_unary("/linattn.v1.AttentionService/GetSession",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        with self.assertRaises(self.grpc.RpcError) as e:
            call(b"\x0a\x02\xff\xfe", timeout=10)
        self.assertEqual(e.exception.code(), self.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("session_id", e.exception.details())
        self.assertIn("UTF-8", e.exception.details())


if __name__ == "__main__":
    SERVER = sys.argv.pop(1)
    unittest.main(verbosity=2)
