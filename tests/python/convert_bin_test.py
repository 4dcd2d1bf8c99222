#!/usr/bin/python3
"""tools/convert_bin.py on checkpoints it writes itself: a model saved as
PyTorch .bin (one file, sharded with an index, F32 and BF16) converts to the
same model, and files that are not plain tensor maps are refused."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")
spec = importlib.util.spec_from_file_location("convert_bin", os.path.join(TOOLS, "convert_bin.py"))
convert_bin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(convert_bin)
ref = convert_bin.linattn_ref
torch = ref.torch

CONFIG = {"model_type": "gated_deltanet", "hidden_size": 16, "num_hidden_layers": 2,
          "num_heads": 2, "num_v_heads": 4, "head_dim": 4, "expand_v": 1, "vocab_size": 30,
          "tie_word_embeddings": True}
TOKENS = torch.tensor([[1, 4, 9, 16, 25, 2]])


def write_source(d, model, dtype=torch.float32, shards=1):
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(model.c.raw, f)
    sd = {k: v.to(dtype) for k, v in model.state_dict().items()}
    if shards == 1:
        torch.save(sd, os.path.join(d, "pytorch_model.bin"))
        return
    names = sorted(sd)
    weight_map = {}
    for i in range(shards):
        part = {n: sd[n] for n in names[i::shards]}
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, os.path.join(d, file))
        weight_map.update({n: file for n in part})
    with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.model = ref.random_model(CONFIG, 7).eval()

    def logits(self, model_dir):
        with torch.no_grad():
            return ref.load_model(model_dir)(TOKENS)

    def test_single_file_f32_is_the_same_model(self):
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out:
            write_source(src, self.model)
            self.assertEqual(convert_bin.convert(src, out), ("F32", len(self.model.state_dict())))
            with torch.no_grad():
                want = self.model(TOKENS)
            self.assertTrue(torch.equal(self.logits(out), want))
            self.assertTrue(os.path.exists(os.path.join(out, "config.json")))

    def test_sharded_bf16_matches_the_safetensors_writer(self):
        # The tied lm_head shares storage with the embeddings: both names.
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out, \
                tempfile.TemporaryDirectory() as direct:
            write_source(src, self.model, torch.bfloat16, shards=3)
            dtype, _ = convert_bin.convert(src, out)
            self.assertEqual(dtype, "BF16")
            ref.save_model(self.model, direct, "BF16")
            self.assertTrue(torch.equal(self.logits(out), self.logits(direct)))

    def test_refuses_code_and_non_tensors(self):
        class Payload:
            def __reduce__(self):
                return (os.system, ("echo should-not-run",))

        for content, words in ((Payload(), "not a plain tensor checkpoint"),
                               ({"w": torch.ones(2, dtype=torch.int64)}, "only F32, F16"),
                               ([torch.ones(2)], "not a name -> tensor map")):
            with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out:
                torch.save(content, os.path.join(src, "pytorch_model.bin"))
                with self.assertRaises(ValueError) as e:
                    convert_bin.convert(src, out)
                self.assertIn(words, str(e.exception))
                self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))

    def test_command_line_names_the_problem(self):
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, os.path.join(TOOLS, "convert_bin.py"), src, out],
                               capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no pytorch_model.bin", r.stderr)


if __name__ == "__main__":
    unittest.main()
