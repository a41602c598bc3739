"""The offline instruction corpus of the embedded tiny target (DESIGN §11).

Three domains, each built from material every Python install carries, so the corpus
can be rebuilt anywhere without a network:

- ``math``: generated grade-school word problems with step-by-step solutions that end
  in ``\\boxed{answer}``;
- ``code``: functions and methods of the running interpreter's standard library
  (prompt: signature and docstring in a fenced block; answer: the function);
- ``chat``: English prose from ``pydoc_data`` topics and module/class docstrings
  (prompt: "Explain ..."; answer: the passage).

Every item carries a stable ``key``; the held-out split (built-in prompt sets and
held-out loss) is chosen by hashing the key, so it is disjoint from training by
construction.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import random
import re
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
DOMAINS = ("math", "code", "chat")


@dataclass(frozen=True)
class Item:
    domain: str
    key: str  # stable identity, used for dedup and the held-out split
    prompt: str
    answer: str


def is_held_out(key: str, share: float = 0.04) -> bool:
    """Deterministic held-out membership by hash of the item key."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < share


# ----------------------------------------------------------------------------- math

_NAMES = [
    "Ava",
    "Ben",
    "Carla",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Iris",
    "Jamal",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
    "Uma",
    "Victor",
    "Wen",
    "Yusuf",
]
_THINGS = [
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "books",
    "cards",
    "shells",
    "stamps",
    "balloons",
    "oranges",
    "toy cars",
    "beads",
    "cupcakes",
    "notebooks",
    "plants",
]
_PLACES = ["bakery", "library", "farm", "school", "garden", "shop", "market", "museum"]


def _math_add_sub(rng: random.Random) -> tuple[str, list[str], int]:
    n, t = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b, c = rng.randint(10, 90), rng.randint(5, 60), rng.randint(2, 40)
    c = min(c, a + b - 1)
    q = (
        f"{n} has {a} {t}. A friend gives {n} {b} more {t}, and then {n} gives away {c} {t}. "
        f"How many {t} does {n} have now?"
    )
    s = [
        f"{n} starts with {a} {t}.",
        f"After getting {b} more, {n} has {a} + {b} = {a + b} {t}.",
        f"After giving away {c}, {n} has {a + b} - {c} = {a + b - c} {t}.",
    ]
    return q, s, a + b - c


def _math_mul(rng: random.Random) -> tuple[str, list[str], int]:
    n, t = rng.choice(_NAMES), rng.choice(_THINGS)
    boxes, per, extra = rng.randint(2, 12), rng.randint(3, 25), rng.randint(1, 30)
    q = (
        f"{n} buys {boxes} boxes of {t}. Each box holds {per} {t}. {n} already had {extra} {t}. "
        f"How many {t} does {n} have in total?"
    )
    s = [
        f"The boxes hold {boxes} x {per} = {boxes * per} {t}.",
        f"Adding the {extra} {t} {n} already had gives {boxes * per} + {extra} = {boxes * per + extra} {t}.",
    ]
    return q, s, boxes * per + extra


def _math_div(rng: random.Random) -> tuple[str, list[str], int]:
    n, t = rng.choice(_NAMES), rng.choice(_THINGS)
    k, each = rng.randint(2, 9), rng.randint(3, 20)
    total = k * each
    q = f"{n} has {total} {t} and shares them equally among {k} friends. How many {t} does each friend get?"
    s = [f"{n} shares {total} {t} among {k} friends.", f"Each friend gets {total} / {k} = {each} {t}."]
    return q, s, each


def _math_money(rng: random.Random) -> tuple[str, list[str], int]:
    n, t, p = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_PLACES)
    price, qty, paid = rng.randint(2, 15), rng.randint(2, 9), 0
    cost = price * qty
    paid = (cost // 10 + rng.randint(1, 5)) * 10
    q = (
        f"At the {p}, {t} cost ${price} each. {n} buys {qty} of them and pays with ${paid}. "
        f"How much change does {n} get?"
    )
    s = [f"The {t} cost {qty} x ${price} = ${cost}.", f"The change is ${paid} - ${cost} = ${paid - cost}."]
    return q, s, paid - cost


def _math_rate(rng: random.Random) -> tuple[str, list[str], int]:
    n = rng.choice(_NAMES)
    speed, hours, extra = rng.randint(20, 70), rng.randint(2, 8), rng.randint(5, 60)
    q = (
        f"{n} drives at {speed} miles per hour for {hours} hours, then drives {extra} more miles. "
        f"How many miles does {n} drive in all?"
    )
    s = [
        f"In {hours} hours at {speed} miles per hour, {n} drives {speed} x {hours} = {speed * hours} miles.",
        f"Adding {extra} more miles gives {speed * hours} + {extra} = {speed * hours + extra} miles.",
    ]
    return q, s, speed * hours + extra


def _math_percent(rng: random.Random) -> tuple[str, list[str], int]:
    n, t = rng.choice(_NAMES), rng.choice(_THINGS)
    total = rng.randint(2, 20) * 20
    pct = rng.choice([10, 20, 25, 50, 75])
    part = total * pct // 100
    q = f"{n} has {total} {t}. {n} sells {pct}% of them. How many {t} are left?"
    s = [
        f"{pct}% of {total} is {total} x {pct} / 100 = {part}.",
        f"{n} has {total} - {part} = {total - part} {t} left.",
    ]
    return q, s, total - part


def _math_multi(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.sample(_NAMES, 2)
    t = rng.choice(_THINGS)
    x = rng.randint(4, 30)
    mult, diff = rng.randint(2, 5), rng.randint(1, 15)
    y = x * mult - diff
    q = (
        f"{a} has {x} {t}. {b} has {diff} fewer than {mult} times as many {t} as {a}. "
        f"How many {t} do they have together?"
    )
    s = [
        f"{mult} times as many as {a} is {mult} x {x} = {x * mult} {t}.",
        f"{b} has {x * mult} - {diff} = {y} {t}.",
        f"Together they have {x} + {y} = {x + y} {t}.",
    ]
    return q, s, x + y


def _math_time(rng: random.Random) -> tuple[str, list[str], int]:
    n = rng.choice(_NAMES)
    days, per_day, weeks = rng.randint(2, 7), rng.randint(10, 90), rng.randint(2, 6)
    q = (
        f"{n} practices piano for {per_day} minutes a day, {days} days a week. "
        f"How many minutes does {n} practice in {weeks} weeks?"
    )
    s = [
        f"Each week {n} practices {per_day} x {days} = {per_day * days} minutes.",
        f"In {weeks} weeks that is {per_day * days} x {weeks} = {per_day * days * weeks} minutes.",
    ]
    return q, s, per_day * days * weeks


_MATH_TEMPLATES = [
    _math_add_sub,
    _math_mul,
    _math_div,
    _math_money,
    _math_rate,
    _math_percent,
    _math_multi,
    _math_time,
]


def math_items(count: int, seed: int) -> Iterator[Item]:
    rng = random.Random(seed)
    seen: set[str] = set()
    while len(seen) < count:
        question, steps, answer = rng.choice(_MATH_TEMPLATES)(rng)
        if question in seen:
            continue
        seen.add(question)
        solution = "\n".join(steps) + f"\nThe answer is {answer}.\n\\boxed{{{answer}}}"
        yield Item("math", "math:" + question, f"{question}\n{MATH_SUFFIX}", solution)


# ----------------------------------------------------------------------------- code

_SKIP_MODULES = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "test",
    "ensurepip",
    "venv",
    "pydoc_data",
    "__phello__",
    "_pydecimal",
    "sre_compile",
    "sre_parse",
}


def _stdlib_modules() -> Iterator[object]:
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _SKIP_MODULES:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield importlib.import_module(name)
        except Exception:  # noqa: BLE001 - platform-specific modules may fail to import
            continue


def _function_item(qualname: str, fn: object) -> Item | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    doc = inspect.getdoc(fn)
    if not doc or len(doc) < 20 or not source.lstrip().startswith("def ") or len(source) > 2000:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef) or len(node.body) < 2:
        return None
    header = source.splitlines()[node.lineno - 1 : node.body[0].lineno - 1]
    signature = "\n".join(header)
    doc_short = doc if len(doc) <= 400 else doc[:400].rsplit(" ", 1)[0] + " ..."
    doc_block = textwrap.indent('"""' + doc_short + '"""', "    ")
    prompt = f"Complete the following Python function.\n```python\n{signature}\n{doc_block}\n```"
    return Item("code", "code:" + qualname, prompt, f"```python\n{source.rstrip()}\n```")


def code_items() -> Iterator[Item]:
    """Functions and methods with docstrings from the standard library, one item per definition."""
    seen: set[str] = set()
    for module in _stdlib_modules():
        mname = module.__name__
        for name, obj in sorted(vars(module).items()):
            if name.startswith("__") or getattr(obj, "__module__", None) != mname:
                continue
            candidates = [(f"{mname}.{name}", obj)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                candidates += [
                    (f"{mname}.{name}.{m}", f)
                    for m, f in sorted(vars(obj).items())
                    if inspect.isfunction(f) and not m.startswith("__")
                ]
            for qualname, fn in candidates:
                item = _function_item(qualname, fn)
                if item is not None and item.answer not in seen:
                    seen.add(item.answer)
                    yield item


# ----------------------------------------------------------------------------- chat


def _passages(text: str, max_chars: int = 900) -> Iterator[str]:
    """Split prose into passages of whole paragraphs, dropping code-heavy ones."""
    current: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if len(para) < 40 or para.count(">>>") or sum(c in "{}[]()=" for c in para) > len(para) // 12:
            continue
        if current and sum(map(len, current)) + len(para) > max_chars:
            yield "\n\n".join(current)
            current = []
        current.append(para if len(para) <= max_chars else para[:max_chars].rsplit(". ", 1)[0] + ".")
    if current:
        yield "\n\n".join(current)


def chat_items() -> Iterator[Item]:
    """Prose passages from pydoc topics and standard-library docstrings."""
    from pydoc_data.topics import topics

    for topic, text in sorted(topics.items()):
        title = topic.replace("-", " ")
        for i, passage in enumerate(_passages(text)):
            more = f"Explain more about {title} in Python (part {i + 1})."
            lead = f"Explain {title} in Python." if i == 0 else more
            yield Item("chat", f"chat:topic:{topic}:{i}", lead, passage)
    for module in _stdlib_modules():
        mname = module.__name__
        docs = [(mname, "module", inspect.getdoc(module))]
        for n, o in sorted(vars(module).items()):
            if n.startswith("_") or getattr(o, "__module__", None) != mname:
                continue
            if inspect.isclass(o):
                docs.append((f"{mname}.{n}", "class", inspect.getdoc(o)))
                docs += [
                    (f"{mname}.{n}.{m}", "method", inspect.getdoc(f))
                    for m, f in sorted(vars(o).items())
                    if inspect.isfunction(f) and not m.startswith("_")
                ]
            elif inspect.isfunction(o):
                docs.append((f"{mname}.{n}", "function", inspect.getdoc(o)))
        for name, kind, doc in docs:
            if not doc or len(doc) < 120:
                continue
            passage = next(_passages(doc), None)
            if passage and len(passage) >= 100:
                prompt = f"Explain what the Python {kind} `{name}` is for."
                yield Item("chat", f"chat:{kind}:{name}", prompt, passage)


def build_corpus(math_count: int, seed: int = 0) -> list[Item]:
    """All items of the three domains, deduplicated, in a deterministic order."""
    items = [*math_items(math_count, seed), *code_items(), *chat_items()]
    unique: dict[str, Item] = {}
    for item in items:
        unique.setdefault(item.key, item)
    return list(unique.values())


def corpus_hash(items: list[Item]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(f"{item.domain}\0{item.key}\0{item.prompt}\0{item.answer}\0".encode())
    return h.hexdigest()


def training_records(math_count: int = 4000, seed: int = 0) -> list[dict]:
    """The tiny target's training items (held-out ones excluded) as chat records."""
    return [
        {
            "conversations": [
                {"role": "user", "content": i.prompt},
                {"role": "assistant", "content": i.answer},
            ],
            "domain": i.domain,
        }
        for i in build_corpus(math_count, seed)
        if not is_held_out(i.key)
    ]
