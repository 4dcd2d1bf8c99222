#!/usr/bin/python3
"""bench/serving_profile.py's attribution on perf script text written by hand:
each sample lands in the component its rules name, and the µs per step are
the samples' periods over the session-steps."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import serving_profile  # noqa: E402

# Ten samples of 1 ms each (one of 2 ms) (perf script -F comm,tid,period,event,ip,sym,dso
# with callchains), one per rule.
SCRIPT = """\
worker 101 1000000 cpu-clock:ppp: 
\t    1f622 [unknown] (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)

worker 101 1000000 cpu-clock:ppp: 
\t    7f3a1c00 [unknown] (/tmp/perf-4242.map)

worker 101 1000000 cpu-clock:ppp: 
\t    8a0c0 linattn::avx512::(anonymous namespace)::StepHeadRegisters<4>+0x40 (/work/build/bin/linattn-server)

grpc 102 1000000 cpu-clock:ppp: 
\tffffffff8206d8ce tcp_sendmsg_locked+0x5fe ([kernel.kallsyms])
\tffffffff81e7e1e8 ____sys_sendmsg+0x2b8 ([kernel.kallsyms])
\t          10ac4d __libc_sendmsg+0x4d (/usr/lib/x86_64-linux-gnu/libc.so.6)

grpc 102 1000000 cpu-clock:ppp: 
\tffffffff8144e39a futex_wake+0x19a ([kernel.kallsyms])
\tffffffff8144a843 do_futex+0x183 ([kernel.kallsyms])
\t          101829 syscall+0x19 (/usr/lib/x86_64-linux-gnu/libc.so.6)

grpc 102 1000000 cpu-clock:ppp: 
\t          2f0a1 google::protobuf::internal::ReadTag+0x11 (/usr/lib/x86_64-linux-gnu/libprotobuf.so.32.0.12)

grpc 102 1000000 cpu-clock:ppp: 
\tffffffff81604a94 __handle_mm_fault+0x314 ([kernel.kallsyms])
\tffffffff82260286 exc_page_fault+0x176 ([kernel.kallsyms])
\t          16e0ba __memset_avx512_unaligned_erms+0x7a (/usr/lib/x86_64-linux-gnu/libc.so.6)

grpc 102 1000000 cpu-clock:ppp: 
\t          16e0ba __memmove_avx512_unaligned_erms+0x7a (/usr/lib/x86_64-linux-gnu/libc.so.6)

grpc 102 2000000 cpu-clock:ppp: 
\t          4e2355 grpc_core::FilterStackCall::ExternalRef+0x5 (/usr/lib/x86_64-linux-gnu/libgrpc.so.29.0.0)
\t               0 [unknown] ([unknown])

grpc 102 1000000 cpu-clock:ppp: 
\t            fe8c _dl_fixup+0x7c (/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)
"""


class Attribution(unittest.TestCase):
    def test_each_rule(self):
        samples = serving_profile.parse_script(SCRIPT)
        self.assertEqual(len(samples), 10)
        got = [serving_profile.classify(frames) for _, frames in samples]
        self.assertEqual(got, ["OpenMP waits", "compute", "compute", "transport", "scheduling",
                               "(de)serialisation", "allocation", "copies", "transport",
                               "other"])

    def test_microseconds_per_step(self):
        a = serving_profile.attribute(serving_profile.parse_script(SCRIPT), session_steps=100)
        self.assertAlmostEqual(a["cpu_seconds"], 0.011)
        self.assertAlmostEqual(a["us_per_step_total"], 110.0)  # 11 ms over 100 steps
        self.assertAlmostEqual(a["us_per_step"]["transport"], 30.0)  # 1 ms + 2 ms
        self.assertAlmostEqual(a["us_per_step"]["compute"], 20.0)
        self.assertAlmostEqual(sum(a["us_per_step"].values()), 110.0)
        self.assertEqual(a["other_top"][0][0], "_dl_fixup (ld-linux-x86-64.so.2)")


if __name__ == "__main__":
    unittest.main()
