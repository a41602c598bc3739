from dspark.eval.target_report import code_parses, ends_boxed, is_looping


def test_ends_boxed():
    assert ends_boxed("2 + 2 = 4\n\\boxed{4}")
    assert ends_boxed("\\boxed{12}  \n")
    assert not ends_boxed("\\boxed{4} and then more text")
    assert not ends_boxed("no answer")


def test_code_parses_reads_the_first_fence():
    assert code_parses("```python\ndef f(x):\n    return x\n```\ntrailing prose")
    assert not code_parses("```python\ndef f(x:\n```")
    assert code_parses("```python\ndef f():\n    return 1\n")  # unterminated fence, cut by max_tokens


def test_is_looping():
    assert is_looping([1, 2, 3, 4] * 6, n=4, repeats=3)
    assert not is_looping(list(range(40)), n=4, repeats=3)
    assert is_looping([9, 8] + [5, 6, 7, 8, 1, 2, 3, 4] * 3, n=8, repeats=3)
