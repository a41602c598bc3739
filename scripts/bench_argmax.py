"""The greedy token on a CPU: ``torch.argmax`` against the blocked argmax (issue 17).

A greedy round takes the argmax of the target's verified rows and the drafter's drafted
rows; ``sampling/argmax.py: greedy_tokens`` finds it from vectorised block maxima. Timed on
random logits (with ties), one thread, thread CPU time, medians of 20; each pair is
checked to give the same indices.

    python scripts/bench_argmax.py [V,...] [rows,...]

Rows: 8 is one request verifying 7 drafts, 64 a batch of 64 decoding, 512 64 requests
verifying 7 drafts each.
"""

# ruff: noqa: E501 (report lines)
import statistics
import sys
import time

import torch

from dspark.sampling.argmax import greedy_tokens

torch.set_num_threads(1)
vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4096,49152,151936").split(",")]
row_counts = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,8,64,128,512").split(",")]


def median_ms(fn, x) -> float:
    times = []
    for _ in range(20):
        t = time.thread_time()
        fn(x)
        times.append(time.thread_time() - t)
    return 1e3 * statistics.median(times)


for dtype in (torch.float32, torch.bfloat16):
    for V in vocabs:
        for n in row_counts:
            x = torch.randn(n, V, generator=torch.Generator().manual_seed(n)).mul(4).round().to(dtype)
            assert torch.equal(greedy_tokens(x), x.argmax(-1))
            old, new = median_ms(lambda x: x.argmax(-1), x), median_ms(greedy_tokens, x)
            print(
                f"{str(dtype)[6:]:>8} V={V:>6} rows={n:>3}: torch.argmax {old:8.3f} ms, blocked {new:7.3f} ms ({old / max(new, 1e-6):.1f}x)",
                flush=True,
            )
