import ast
import json
import platform

import pytest

from dspark.presets.tiny import assets_dir, builtin_prompts
from dspark.tiny.corpus import DOMAINS, build_corpus, code_items, corpus_hash, is_held_out, math_items
from dspark.tiny.tokenizer import CHAT_TEMPLATE, render_chat


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(400, seed=0)


def test_all_domains_present_and_deduplicated(corpus):
    domains = {item.domain for item in corpus}
    assert domains == set(DOMAINS)
    assert len({item.key for item in corpus}) == len(corpus)


def test_math_solutions_end_boxed_with_the_stated_answer():
    for item in math_items(200, seed=1):
        assert item.prompt.endswith("put your final answer within \\boxed{}.")
        last_line = item.answer.splitlines()[-1]
        stated = item.answer.splitlines()[-2]
        assert last_line.startswith("\\boxed{") and stated == f"The answer is {last_line[7:-1]}."


def test_code_answers_parse_and_prompts_hold_the_signature():
    items = list(code_items())
    assert len(items) > 1000  # the standard library has thousands of functions
    for item in items[:300]:
        source = item.answer.removeprefix("```python\n").removesuffix("\n```")
        ast.parse(source)
        assert item.prompt.splitlines()[2].lstrip().startswith("def ")


def test_held_out_split_is_deterministic_and_small(corpus):
    held = [i for i in corpus if is_held_out(i.key)]
    assert 0 < len(held) < 0.1 * len(corpus)
    assert held == [i for i in corpus if is_held_out(i.key)]


def test_builtin_prompts_are_disjoint_from_training():
    manifest = json.loads((assets_dir() / "tiny_target" / "manifest.json").read_text())
    corpus = build_corpus(manifest["config"]["math_items"], seed=manifest["config"]["seed"])
    train_prompts = {i.prompt for i in corpus if not is_held_out(i.key)}
    for domain in DOMAINS:
        for record in builtin_prompts(domain):
            assert record["turns"][0] not in train_prompts


def test_shipped_manifest_matches_this_corpus_on_the_same_python():
    manifest = json.loads((assets_dir() / "tiny_target" / "manifest.json").read_text())
    if manifest["python"] != platform.python_version():
        pytest.skip("the code corpus depends on the interpreter's standard library")
    corpus = build_corpus(manifest["config"]["math_items"], seed=manifest["config"]["seed"])
    assert corpus_hash(corpus) == manifest["corpus_sha256"]


def test_render_chat_matches_the_jinja_template():
    import jinja2

    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    messages = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    assert template.render(messages=messages, add_generation_prompt=False) == render_chat("Q?", "A.")
    assert template.render(messages=messages[:1], add_generation_prompt=True) == render_chat("Q?")
