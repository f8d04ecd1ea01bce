#!/usr/bin/env python3
"""Tests of mqb_bench.py's host-side logic that need no GPU, torch or transformers (run by
`make test`): the decode benchmark's rounds of variants (run_variants)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mqb_bench  # noqa: E402  (the path above first)


class RunVariants(unittest.TestCase):
    def run_script(self, batches, variants, rounds, table):
        """table[(B, name)]: the tok/s of each round (or an exception to raise); tokens are
        [B] except for a variant named 'other', whose are [B + 1]."""
        calls, lines = [], []
        names = {id(opts): name for name, opts in variants}

        def measure(B, opts):
            name = names[id(opts)]
            calls.append((B, name))
            v = table[(B, name)]
            if isinstance(v, Exception):
                raise v
            tps = v[sum(1 for c in calls if c == (B, name)) - 1]
            return tps, B / tps, [B + 1] if name == "other" else [B]

        ours = mqb_bench.run_variants(batches, variants, rounds, measure,
                                      out=lambda s, flush=False: lines.append(s))
        return ours, calls, lines

    def test_rounds_alternate_and_report_medians(self):
        variants = [("default", {}), ("k=1", {"k": 1}), ("other", {"o": 1})]
        table = {(1, "default"): [100, 104, 90, 110], (1, "k=1"): [110, 112, 108, 200], (1, "other"): [1, 1, 1, 1]}
        ours, calls, lines = self.run_script([1], variants, 4, table)
        # Each round runs every variant in the same order before the next round starts.
        self.assertEqual(calls, [(1, "default"), (1, "k=1"), (1, "other")] * 4)
        self.assertEqual(ours["b1_default"]["runs"], [100, 104, 90, 110])
        self.assertEqual(ours["b1_default"]["tok_s"], 102)  # the mean of the middle two
        self.assertEqual(ours["b1_k=1"]["tok_s"], 111)
        self.assertAlmostEqual(ours["b1_k=1"]["step_ms"], (1 / 112 + 1 / 110) / 2 * 1e3)  # its own median
        self.assertTrue(ours["b1_k=1"]["same_tokens_as_default"])
        self.assertFalse(ours["b1_other"]["same_tokens_as_default"])
        self.assertIn("BENCH median batch  1 k=1                111 tok/s of 4 rounds (110, 112, 108, 200)"
                      "  +8.8 % against the default", lines)
        self.assertTrue(any(line.endswith("(round 4)") for line in lines))

    def test_one_round_prints_as_before(self):
        variants = [("default", {}), ("tile", {"tile_max_b": 32}), ("attn_split2", {"attn_split": 2})]
        table = {(1, "default"): [1203.0], (32, "default"): [24000.0], (32, "tile"): [20000.0],
                 (1, "attn_split2"): [1100.0]}
        ours, calls, lines = self.run_script([1, 32], variants, 1, table)
        # tile equals the default up to 16 rows, and batch 32 takes no position splits.
        self.assertEqual(calls, [(1, "default"), (1, "attn_split2"), (32, "default"), (32, "tile")])
        self.assertEqual(lines[0], "BENCH ours batch  1 default           1203 tok/s  (0.831 ms/step)")
        self.assertEqual(lines[1], "BENCH ours batch  1 attn_split2       1100 tok/s  (0.909 ms/step)  same tokens: True")
        self.assertFalse(any("median" in line for line in lines))
        self.assertEqual(ours["b32_tile"]["tok_s"], 20000.0)

    def test_unavailable_switch_is_skipped_once(self):
        variants = [("default", {}), ("tc_products", {"tc_min_b": 1})]
        table = {(1, "default"): [10, 12], (1, "tc_products"): mqb_bench.SwitchUnavailable("not built")}
        ours, calls, lines = self.run_script([1], variants, 2, table)
        self.assertEqual(calls, [(1, "default"), (1, "tc_products"), (1, "default")])
        self.assertNotIn("b1_tc_products", ours)
        self.assertIn("BENCH ours batch  1 tc_products  skipped: not built", lines)


if __name__ == "__main__":
    unittest.main()
