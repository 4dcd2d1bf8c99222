#!/usr/bin/python3
"""tools/word_fraction.py on texts whose answers are counted by hand."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "tools", "word_fraction.py")
spec = importlib.util.spec_from_file_location("word_fraction", TOOL)
wf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wf)

TRAIN = "In the beginning God created the heaven and the earth.\nAnd the earth was void."


class WordFractionTest(unittest.TestCase):
    def test_counts_words_of_four_letters_or_more_without_case(self):
        # Sample words of >= 4 letters: Heaven, earth, thee, Beginnings, void:
        # heaven, earth, void are training words (case ignored); "thee" and
        # "beginnings" are not ("beginning" is). "and", "the", "was" are
        # shorter and not counted. 3 of 5.
        r = wf.fraction(TRAIN, ["Heaven and earth, thee; the Beginnings was void"])
        self.assertEqual((r["words"], r["known"]), (5, 3))
        self.assertAlmostEqual(r["fraction"], 0.6)
        self.assertEqual(r["unknown"], ["beginnings", "thee"])

    def test_words_split_at_anything_but_letters(self):
        # "earth's" is "earth" and "s"; "void2void" is two words; "x-void"
        # gives "void". 4 words, all known.
        r = wf.fraction(TRAIN, ["earth's void2void x-void"])
        self.assertEqual((r["words"], r["known"]), (4, 4))

    def test_no_words_is_a_zero_fraction_not_an_error(self):
        self.assertEqual(wf.fraction(TRAIN, ["a an the"])["fraction"], 0.0)

    def test_command_line_with_stdin(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(TRAIN)
        try:
            r = subprocess.run([sys.executable, TOOL, "--train", f.name, "-"],
                               input="created heaven qqqq", capture_output=True, text=True,
                               check=True)
        finally:
            os.unlink(f.name)
        out = json.loads(r.stdout)
        self.assertEqual((out["words"], out["known"]), (3, 2))


if __name__ == "__main__":
    unittest.main()
