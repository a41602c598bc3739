"""What materialising one-hot drafts cost a greedy round, by vocabulary and batch (issue 17).

Before, a deterministic draft block (n-gram lookup, or a drafter whose requests are all
greedy) carried one-hot rows ``[R, K, V]``; the verify stage processed the target's logits
into greedy one-hot rows ``[R, K+1, V]`` and the confidence estimator read the peaks
``max_v p_d`` of the draft rows. Now the block carries ``probs=None`` and a greedy
batch is verified from the logits' argmax (``verify_greedy``). Both ways are timed here on
random logits, one thread, thread CPU time, medians of 20, with the target's own work (the
forward producing the logits) left out: this is the overhead per round the change removes.

    python scripts/bench_one_hot.py [V,...] [R,...]
"""

# ruff: noqa: E501 (report lines)
import statistics
import sys
import time

import torch

from dspark.protocols import DraftBlock, SamplingParams
from dspark.sampling import batch_probs, verify, verify_greedy

torch.set_num_threads(1)
K = 7
vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4096,49152,151936").split(",")]
batches = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,4,16,64").split(",")]
GREEDY = SamplingParams(temperature=0.0)


def before(tokens, lengths, logits):
    R, V = tokens.shape[0], logits.shape[-1]
    probs = torch.zeros(R, K, V).scatter_(-1, tokens.unsqueeze(-1), 1.0)  # the drafter's one-hot rows
    block = DraftBlock(tokens=tokens, lengths=lengths, probs=probs)
    target_probs = batch_probs(logits, [GREEDY] * R)  # greedy one-hot rows [R, K+1, V]
    # (an all-greedy batch skipped the verify stage's copy of the draft rows already)
    out = verify(tokens, lengths, None, target_probs, greedy=torch.ones(R, dtype=torch.bool))
    return out, block.probs.amax(-1)


def after(tokens, lengths, logits):
    block = DraftBlock(tokens=tokens, lengths=lengths, probs=None)
    return verify_greedy(tokens, lengths, logits.argmax(-1)), block.peaks()


def median_ms(fn, *args) -> float:
    times = []
    for _ in range(20):
        t = time.thread_time()
        fn(*args)
        times.append(time.thread_time() - t)
    return 1e3 * statistics.median(times)


for V in vocabs:
    for R in batches:
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(R, K + 1, V, generator=g)
        tokens = logits[:, :K].argmax(-1)
        tokens[:, 3:] = torch.randint(0, V, (R, K - 3), generator=g)  # some rejections
        lengths = torch.full((R,), K)
        a, b = before(tokens, lengths, logits)[0], after(tokens, lengths, logits)[0]
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens)
        old, new = median_ms(before, tokens, lengths, logits), median_ms(after, tokens, lengths, logits)
        print(
            f"V={V:>6} R={R:>2}: one-hot rows built {old:8.3f} ms/round, not built {new:6.3f} ms/round ({old / max(new, 1e-6):.0f}x)"
        )
