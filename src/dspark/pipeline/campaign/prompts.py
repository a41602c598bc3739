"""Training prompts made offline, for targets that bring none (SmolLM2).

A target trained elsewhere has no corpus of its own here, and the benchmark sets are
for measuring only. These prompts are composed from templates and word lists with a
seeded generator — word problems, code tasks, explanations — so that the target's own
answers to them (regeneration) become the drafters' training data. They are
deterministic: the same ``(count, seed)`` gives the same prompts in the same order.
"""

from __future__ import annotations

import random

from dspark.data.prompts import Prompt

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena")
ITEMS = ("apples", "pencils", "books", "stickers", "marbles", "cookies", "tickets", "stamps", "cards")
MATH = (
    "{a} has {x} {item}. {b} has {y} more {item} than {a}. How many {item} do they have together?",
    "A box holds {x} {item}. How many {item} are in {y} boxes?",
    "{a} buys {x} {item} at {p} dollars each and pays with a {q}-dollar bill. How much change does {a} get?",
    "{a} reads {x} pages a day. How many days does it take to read a book of {z} pages?",
    "A train travels {x} km in {y} hours. What is its average speed in km per hour?",
    "{a} saves {x} dollars a week. After {y} weeks, {a} spends {p} dollars. How much is left?",
    "The sum of two numbers is {z} and their difference is {x}. What are the numbers?",
    "A rectangle is {x} cm long and {y} cm wide. What are its area and its perimeter?",
)
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE_TASKS = (  # (function name, what it does)
    ("reverse_words", "reverses the words of a sentence"),
    ("count_vowels", "counts the vowels in a string"),
    ("fibonacci", "returns the n-th Fibonacci number"),
    ("is_palindrome", "checks whether a string is a palindrome"),
    ("merge_sorted", "merges two sorted lists into one sorted list"),
    ("dedupe", "removes duplicates from a list while keeping the order"),
    ("min_max", "returns the largest and the smallest value of a list"),
    ("factorial", "computes the factorial of n without recursion"),
    ("group_by_initial", "groups a list of words by their first letter"),
    ("is_prime", "checks whether a number is prime"),
    ("flatten", "flattens a nested list of integers"),
    ("word_counts", "counts how often each word occurs in a text"),
    ("celsius_to_fahrenheit", "converts a temperature from Celsius to Fahrenheit"),
    ("running_sum", "returns the running sum of a list"),
)
PARAM_TASKS = (
    ("top_k", "returns the {k} largest values of a list"),
    ("long_words", "counts the words longer than {k} letters in a text"),
    ("all_divisible", "checks whether every number of a list is divisible by {k}"),
    ("rotate", "rotates a list by {k} positions"),
    ("chunks", "splits a list into chunks of {k} elements"),
    ("digit_sum", "returns the sum of the digits of n written in base {k}"),
)
CODE_NOTES = (
    "",
    " Handle empty input.",
    " Use only a loop, no library helpers.",
    " State its time complexity.",
    " Include a short test with assert statements.",
    " Keep it under ten lines.",
)
CODE = (
    "Write a Python function `{fn}` that {task}.",
    "Write a Python function `{fn}` that {task}. Add a docstring and type hints.",
    "Implement `{fn}` in Python: it {task}. Then show two example calls.",
)
TOPICS = (
    "photosynthesis", "how a bicycle stays upright", "why the sky is blue", "compound interest",
    "how vaccines work", "the water cycle", "what a hash table is", "why leaves change colour",
    "how a refrigerator works", "the difference between weather and climate", "what recursion is",
    "how bees make honey", "what inflation is", "how a compass works", "why we have seasons",
    "how the internet routes a message", "what DNA does", "how a rainbow forms", "what a budget is",
    "how an electric motor works", "why bread rises", "what a black hole is", "how tides work",
    "what an API is", "how glasses correct vision", "why ice floats", "what a database index is",
    "how plants drink water", "what a prime number is", "how a camera lens focuses",
)  # fmt: skip
CHAT_NOTES = (
    "",
    " Use an analogy.",
    " Keep it under 120 words.",
    " End with a question to check understanding.",
)
AUDIENCES = ("a ten-year-old", "a high-school student", "a busy manager", "a curious adult")
EXPLAIN = (
    "Explain {topic} to {audience}.",
    "Explain {topic} to {audience} in three short paragraphs.",
    "Give {audience} a simple explanation of {topic}, with one example.",
)


def _math(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    x, y = rng.randint(2, 40), rng.randint(2, 12)
    values = dict(a=a, b=b, item=rng.choice(ITEMS), x=x, y=y, p=rng.randint(2, 9), q=rng.choice((50, 100)))
    values["z"] = x * y + rng.randint(0, x)
    return rng.choice(MATH).format(**values) + MATH_SUFFIX


def _code(rng: random.Random) -> str:
    if rng.random() < 0.5:
        fn, task = rng.choice(CODE_TASKS)
    else:
        fn, task = rng.choice(PARAM_TASKS)
        task = task.format(k=rng.randint(2, 9))
    return rng.choice(CODE).format(fn=fn, task=task) + rng.choice(CODE_NOTES)


def _explain(rng: random.Random) -> str:
    text = rng.choice(EXPLAIN).format(topic=rng.choice(TOPICS), audience=rng.choice(AUDIENCES))
    return text + rng.choice(CHAT_NOTES)


DOMAINS = {"math": _math, "code": _code, "chat": _explain}


def synthetic_prompts(count: int, seed: int = 0) -> list[Prompt]:
    """``count`` distinct prompts, math / code / chat in turn, from a generator seeded with ``seed``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    prompts: list[Prompt] = []
    domains = list(DOMAINS)
    attempts = 0
    while len(prompts) < count:
        attempts += 1
        if attempts > 50 * count:
            raise ValueError(f"the templates give fewer than {count} distinct prompts ({len(prompts)})")
        domain = domains[len(prompts) % len(domains)]
        text = DOMAINS[domain](rng)
        if text in seen:
            continue
        seen.add(text)
        prompts.append(Prompt((text,), domain, f"synthetic:{seed}:{len(prompts)}"))
    return prompts
