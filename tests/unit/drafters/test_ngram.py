import numpy as np
import torch

from dspark.drafters.ngram import NgramConfig, NgramDrafter, lookup
from dspark.protocols import SamplingParams, SequenceState


def test_lookup_prefers_longest_then_most_recent_match():
    #              0  1  2  3  4  5  6  7  8  9
    seq = np.array([5, 6, 7, 1, 6, 7, 2, 9, 6, 7])
    # suffix (6, 7) occurs at 1 and 4; the most recent earlier one (4) is followed by 2, 9
    assert lookup(seq, 3, 1, 4) == [2, 9, 6]
    seq2 = np.array([1, 6, 7, 3, 5, 6, 7, 4, 5, 6, 7])
    # (5, 6, 7) matches at 4 (longer than the (6, 7) match at 1): continuation 4, 5
    assert lookup(seq2, 2, 1, 4) == [4, 5]


def test_lookup_nothing_to_find():
    assert lookup(np.array([1, 2, 3, 4]), 5, 1, 3) == []
    assert lookup(np.array([7]), 5, 1, 3) == []


def test_lookup_respects_min_n():
    seq = np.array([1, 2, 9, 3, 2])
    assert lookup(seq, 2, 1, 3) == [9, 3]
    assert lookup(seq, 2, 2, 3) == []


def test_propose_one_hot_block():
    drafter = NgramDrafter(16, NgramConfig(block_size=4))
    state = SequenceState(0, [1, 2, 3, 4, 1, 2], prompt_len=6)
    empty = SequenceState(1, [1, 2, 3], prompt_len=3)
    block = drafter.propose([state, empty], 7, [SamplingParams()] * 2)
    assert block.tokens.shape == (2, 4)
    assert block.lengths.tolist() == [4, 0]
    assert block.tokens[0].tolist() == [3, 4, 1, 2]
    assert block.probs is None  # deterministic: one-hot at the tokens, never built
    assert torch.equal(block.peaks(), torch.ones(2, 4))


def _brute_force_lookup(tokens: list[int], max_len: int, min_n: int, max_n: int) -> list[int]:
    """The definition, one window at a time: longest suffix first, most recent match first."""
    T = len(tokens)
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        for j in range(T - 1 - n, -1, -1):
            if tokens[j : j + n] == tokens[T - n :]:
                return tokens[j + n : j + n + max_len]
    return []


def test_lookup_agrees_with_the_definition_on_random_sequences():
    rng = np.random.default_rng(0)
    for trial in range(400):
        T = int(rng.integers(1, 60))
        seq = rng.integers(0, 1 + trial % 6, size=T).tolist()  # small vocabularies: many matches
        min_n, max_n = int(rng.integers(1, 3)), int(rng.integers(1, 6))
        max_len = int(rng.integers(1, 8))
        assert lookup(np.array(seq), max_len, min_n, max_n) == _brute_force_lookup(seq, max_len, min_n, max_n)


def test_indexed_lookup_equals_the_lookup_as_the_sequence_grows():
    """``TokenPositions.lookup`` (the payoff controller's) gives ``lookup``'s answer at every
    length of growing sequences, for every n-gram range, and after a sequence shrinks."""
    import random

    import numpy as np

    from dspark.drafters.ngram import TokenPositions

    rng = random.Random(0)
    for trial in range(60):
        vocab = rng.choice([2, 5, 30])
        min_n, max_n = rng.choice([(1, 4), (2, 3), (1, 1), (3, 5), (0, 2)])
        index, tokens = TokenPositions(), []
        for _ in range(80):
            tokens += [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
            if rng.random() < 0.05:
                tokens = tokens[: rng.randrange(1, len(tokens) + 1)]  # shrunk: indexed afresh
            max_len = rng.randrange(0, 8)
            want = lookup(np.asarray(tokens), max_len, min_n, max_n)
            assert index.lookup(tokens, max_len, min_n, max_n) == want, (trial, tokens, min_n, max_n)
