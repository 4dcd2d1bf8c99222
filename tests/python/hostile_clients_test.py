#!/usr/bin/env python3
"""A catalogue of hostile clients against a real linattn-server on loopback.

Clients that never read, read slowly, send without reading, open more
streams than a connection may hold, send huge ids and huge dimensions, all
at once, for a few seconds. Meanwhile a well-behaved client keeps decoding
its own session. The test asserts what README and docs/design.md promise:
the server's resident memory stays under its stated bound (what it held
before, plus --transport-memory, plus slack for what the bound does not
cover: stacks, allocator caches), the well-behaved client keeps a low
latency, a stream whose client stops reading stops too, and every hostile
call gets a status that names what was wrong.

    /usr/bin/python3 tests/python/hostile_clients_test.py build/bin/linattn-server
"""
import glob
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SERVER = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build/bin/linattn-server")
WORK = tempfile.mkdtemp(prefix="linattn_hostile_")
MIB = 1 << 20
TRANSPORT_MIB = 64
SLACK_MIB = 96  # thread stacks, allocator caches: outside both budgets
HOSTILE_SECONDS = 5.0


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def compile_protos(out):
    files = sorted(glob.glob(os.path.join(ROOT, "proto", "**", "*.proto"), recursive=True))
    subprocess.run(["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={out}",
                    f"--grpc_out={out}",
                    f"--plugin=protoc-gen-grpc={shutil.which('grpc_python_plugin')}", *files],
                   check=True)


class HostileClientsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        gen = os.path.join(WORK, "gen")
        os.makedirs(gen)
        compile_protos(gen)
        sys.path.insert(0, gen)
        import grpc
        from linattn.v1 import attention_pb2, attention_pb2_grpc
        from linattn.v1 import generation_pb2, generation_pb2_grpc
        cls.grpc, cls.a, cls.g = grpc, attention_pb2, generation_pb2
        cls.a_grpc, cls.g_grpc = attention_pb2_grpc, generation_pb2_grpc
        port_file = os.path.join(WORK, "port")
        cls.log = open(os.path.join(WORK, "server.log"), "w")
        cls.server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--http-listen", "none", "--port-file", port_file,
             "--log-level", "warn", "--max-state-memory", "256MiB",
             "--transport-memory", f"{TRANSPORT_MIB}MiB", "--max-message-bytes", str(4 * MIB),
             "--max-streams-per-connection", "32"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        cls.port = None
        while time.time() < deadline and cls.port is None:
            if cls.server.poll() is not None:
                raise RuntimeError("the server exited")
            try:
                with open(port_file) as f:
                    cls.port = int(f.read())
            except (OSError, ValueError):
                time.sleep(0.05)
        if cls.port is None:
            raise RuntimeError("the server did not start")

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        try:
            cls.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            cls.server.kill()
        cls.log.close()
        shutil.rmtree(WORK, ignore_errors=True)

    def channel(self):
        # One connection per hostile client: grpcio shares subchannels
        # between channels with equal arguments unless told otherwise.
        return self.grpc.insecure_channel(
            f"127.0.0.1:{self.port}",
            options=[("grpc.use_local_subchannel_pool", 1)])

    def test_hostile_clients_cannot_grow_memory_or_stall_others(self):
        a, g, grpc = self.a, self.g, self.grpc
        good = self.a_grpc.AttentionServiceStub(self.channel())
        spec = a.AttentionSpec(num_heads=2, key_dim=8, value_dim=8)
        mine = good.CreateSession(a.CreateSessionRequest(spec=spec)).session_id
        step = a.DecodeRequest(session_id=mine, q=[0.1] * 16, k=[0.2] * 16, v=[0.3] * 16)

        # The well-behaved client: one Decode stream, one step at a time.
        latencies, stop = [], threading.Event()
        requests = queue.Queue()

        def feed():
            while True:
                r = requests.get()
                if r is None:
                    return
                yield r

        def decode_loop():
            responses = good.Decode(feed())
            while not stop.is_set():
                t = time.perf_counter()
                requests.put(step)
                next(responses)
                latencies.append(time.perf_counter() - t)
            requests.put(None)
            for _ in responses:
                pass

        good_thread = threading.Thread(target=decode_loop)
        good_thread.start()
        time.sleep(1.0)  # warm-up: threads, allocator, first model use
        gen0 = self.g_grpc.GenerationServiceStub(self.channel())
        warm = gen0.CreateSession(g.CreateModelSessionRequest()).session_id
        list(gen0.Generate(g.GenerateRequest(session_id=warm, prompt="And",
                                             sampling=g.SamplingParams(max_tokens=8))))
        baseline = rss_bytes(self.server.pid)
        calm_latencies = len(latencies)

        hostile_calls, errors = [], []
        # 1. Generate streams whose clients never read.
        stalled = []
        for _ in range(8):
            stub = self.g_grpc.GenerationServiceStub(self.channel())
            sid = stub.CreateSession(g.CreateModelSessionRequest()).session_id
            call = stub.Generate(g.GenerateRequest(
                session_id=sid, prompt="In the beginning",
                sampling=g.SamplingParams(max_tokens=1_000_000, temperature=1.0)))
            hostile_calls.append(call)
            stalled.append((stub, sid))
        # 2. Decode streams that send as fast as they can and never read.
        big = a.AttentionSpec(num_heads=4, key_dim=64, value_dim=64)
        for _ in range(8):
            stub = self.a_grpc.AttentionServiceStub(self.channel())
            sid = stub.CreateSession(a.CreateSessionRequest(spec=big)).session_id
            msg = a.DecodeRequest(session_id=sid, q=[0.01] * 256, k=[0.01] * 256,
                                  v=[0.01] * 256)

            def endless(m=msg):
                while not stop.is_set():
                    yield m
            hostile_calls.append(stub.Decode(endless()))
        # 3. More streams on one connection than it may hold.
        crowded = self.a_grpc.AttentionServiceStub(self.channel())
        for _ in range(48):
            hostile_calls.append(crowded.Decode(iter(())))
        # 4. A slow reader.
        slow_stub = self.g_grpc.GenerationServiceStub(self.channel())
        slow_sid = slow_stub.CreateSession(g.CreateModelSessionRequest()).session_id
        slow = slow_stub.Generate(g.GenerateRequest(
            session_id=slow_sid, prompt="Let", sampling=g.SamplingParams(max_tokens=100_000)))
        hostile_calls.append(slow)

        def read_slowly():
            try:
                for _ in slow:
                    if stop.is_set():
                        return
                    time.sleep(0.2)
            except grpc.RpcError:
                pass
        slow_thread = threading.Thread(target=read_slowly)
        slow_thread.start()
        # 5. Huge ids and huge dimensions, over and over.
        rude = self.a_grpc.AttentionServiceStub(self.channel())

        def rude_loop():
            huge_id = "x" * (1 << 20)
            while not stop.is_set():
                for request, method in (
                        (a.GetSessionRequest(session_id=huge_id), rude.GetSession),
                        (a.CreateSessionRequest(spec=a.AttentionSpec(
                            num_heads=65536, key_dim=65536, value_dim=65536)),
                         rude.CreateSession),
                        (a.CreateSessionRequest(spec=a.AttentionSpec(
                            num_heads=1, key_dim=4096, value_dim=1, feature_map="favor")),
                         rude.CreateSession)):
                    try:
                        method(request, timeout=5)
                        errors.append("a hostile request succeeded")
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.INVALID_ARGUMENT,
                                            grpc.StatusCode.RESOURCE_EXHAUSTED):
                            errors.append(f"{e.code()}: {e.details()}")
                        elif len(e.details() or "") > 1024:
                            errors.append("an error message grew with the request")
        rude_thread = threading.Thread(target=rude_loop)
        rude_thread.start()

        peak = baseline
        positions = []
        end = time.time() + HOSTILE_SECONDS
        while time.time() < end:
            peak = max(peak, rss_bytes(self.server.pid))
            time.sleep(0.1)
            if end - time.time() < 2.0 and not positions:
                positions = [s.GetSession(g.GetModelSessionRequest(session_id=i)).position
                             for s, i in stalled]
        later = [s.GetSession(g.GetModelSessionRequest(session_id=i)).position
                 for s, i in stalled]
        peak = max(peak, rss_bytes(self.server.pid))
        stop.set()
        for call in hostile_calls:
            call.cancel()
        good_thread.join(timeout=20)
        slow_thread.join(timeout=20)
        rude_thread.join(timeout=20)

        self.assertEqual(errors, [])
        grown_mib = (peak - baseline) / MIB
        print(f"hostile: RSS {baseline / MIB:.0f} MiB before, peak {peak / MIB:.0f} MiB "
              f"(+{grown_mib:.0f}); well-behaved client {len(latencies) - calm_latencies} steps")
        self.assertLess(grown_mib, TRANSPORT_MIB + SLACK_MIB,
                        "the server's memory grew past its stated bound")
        # A never-read Generate advances only as far as its client's
        # transport accepts messages (each token waits for the previous
        # message to be written), nowhere near the engine's speed
        # (thousands of tokens per second per stream).
        rate = [(b - a) / 2.0 for a, b in zip(positions, later)]
        print(f"hostile: never-read Generate streams at {max(rate):.0f} tokens/s at most, "
              f"positions {later}")
        self.assertTrue(all(p < 5_000 for p in later), later)
        # The well-behaved client kept going, with steps that stayed quick.
        during = sorted(latencies[calm_latencies:])
        self.assertGreater(len(during), 50)
        p99 = during[int(0.99 * (len(during) - 1))]
        print(f"hostile: well-behaved step p50 {during[len(during) // 2] * 1e3:.2f} ms, "
              f"p99 {p99 * 1e3:.2f} ms")
        self.assertLess(p99, 0.5, "an unrelated session's steps stalled")
        # And the server is still healthy for everyone.
        self.assertEqual(good.GetSession(a.GetSessionRequest(session_id=mine)).session_id, mine)


if __name__ == "__main__":
    unittest.main()
