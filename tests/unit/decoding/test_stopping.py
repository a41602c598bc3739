from dspark.decoding.stopping import cut_round


def decode(ids):
    return "".join(chr(97 + i) for i in ids)


def test_eos_kept_and_nothing_after():
    cut = cut_round([0, 1], [2, 9, 3], eos_ids=(9,), max_new=100)
    assert cut.tokens == [2, 9] and cut.finish_reason == "stop"


def test_max_new_counts_earlier_tokens():
    cut = cut_round([0, 1, 2], [3, 4, 5], eos_ids=(), max_new=4)
    assert cut.tokens == [3] and cut.finish_reason == "length"
    assert cut_round([0, 1, 2], [3], eos_ids=(), max_new=5).finish_reason is None


def test_stop_string_spanning_rounds():
    # "bc" starts in the previous round and completes with this round's first token
    cut = cut_round([0, 1], [2, 3, 4], eos_ids=(), max_new=100, stop=("bc",), decode=decode)
    assert cut.tokens == [2] and cut.text == "a" and cut.finish_reason == "stop"


def test_earliest_stop_string_wins():
    cut = cut_round([], [0, 1, 2, 3], eos_ids=(), max_new=100, stop=("cd", "b"), decode=decode)
    assert cut.text == "a" and cut.tokens == [0, 1]
