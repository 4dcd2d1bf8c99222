#!/usr/bin/python3
"""bench/plots.py on a compare.json of known values: every figure is written
as PNG and SVG, the SVG carries the measured values where they are drawn,
and a run without a figure's measurements skips that figure alone."""

import copy
import importlib.util
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")
sys.path.insert(0, BENCH)
spec = importlib.util.spec_from_file_location("plots", os.path.join(BENCH, "plots.py"))
plots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plots)


def results():
    """The parts of compare.json's results the figures read, with values a
    test can recognise."""
    peers = []
    for d in (64, 128):
        for n in (1024, 4096):
            peers.append({"op": "softmax_kv_decode", "context": n, "d": d, "seconds": n * 1e-7 * d})
        for t in (1024, 4096):
            peers.append({"op": "chunkwise", "tokens": t, "d": d, "tokens_per_s": 1e4 * d / t})
            peers.append({"op": "softmax_causal_prefill", "tokens": t, "d": d,
                          "tokens_per_s": 1e3 * d / t})
    flat = {"points": [{"position": 1000, "seconds_per_token": 3e-6},
                       {"position": 100000, "seconds_per_token": 3.1e-6}]}
    sessions = {str(n): {"steps_per_second": 1000.0 * n, "latency_us": {"p99": 250.0 * n}}
                for n in (1, 4, 16, 64)}
    return {
        "date": "2026-12-02T00:00:00+00:00", "quick": False,
        "machine": {"cpu": "test CPU", "cores": 2},
        "attention": {
            "decode": {"64/1": {"seconds": 2e-6}, "128/1": {"seconds": 5e-6},
                       "64/64": {"seconds": 2e-4}},
            "chunkwise": {f"{d}/{t}": {"d": d, "tokens": t, "tokens_per_s": 4e5 / d * 64}
                          for d in (64, 128) for t in (1024, 4096, 16384)}},
        "flatness_in_process": flat,
        "server": {"flatness": flat, "sessions": sessions,
                   "decode_64_batch16": {"steps_per_second": 99000.0}},
        "peers": {"rows": peers},
    }


class PlotsTest(unittest.TestCase):
    def test_every_figure_is_written_as_png_and_svg(self):
        with tempfile.TemporaryDirectory() as out:
            paths = plots.write_all(results(), out)
            self.assertEqual(sorted(os.path.basename(p) for p in paths),
                             sorted(f"{n}.{e}" for n in plots.FIGURES for e in ("png", "svg")))
            for path in paths:
                with open(path, "rb") as f:
                    head = f.read(4096)
                if path.endswith(".png"):
                    self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n", path)
                    self.assertGreater(os.path.getsize(path), 10000, path)
                else:
                    self.assertIn(b"<svg", head, path)

    def test_the_svg_names_every_series_drawn(self):
        with tempfile.TemporaryDirectory() as out:
            plots.write_all(results(), out)
            with open(os.path.join(out, "prefill_vs_tokens.svg")) as f:
                svg = f.read()
            for label in ("linattn chunkwise (d = 64)", "PyTorch chunkwise (d = 128)",
                          "PyTorch causal softmax (d = 64)"):
                self.assertIn(label, svg)
            with open(os.path.join(out, "server_sessions.svg")) as f:
                svg = f.read()
            self.assertIn("DecodeBatch of 16, 64 sessions", svg)
            self.assertIn("in-process batched step, 64 sessions", svg)

    def test_a_run_without_the_session_sweep_skips_that_figure_alone(self):
        res = copy.deepcopy(results())
        del res["server"]["sessions"]  # a compare.json from before the sweep
        messages = []
        with tempfile.TemporaryDirectory() as out:
            paths = plots.write_all(res, out, log=messages.append)
            names = {os.path.splitext(os.path.basename(p))[0] for p in paths}
        self.assertEqual(names, {"decode_vs_context", "prefill_vs_tokens"})
        self.assertEqual(len(messages), 1)
        self.assertIn("server_sessions", messages[0])


if __name__ == "__main__":
    unittest.main()
