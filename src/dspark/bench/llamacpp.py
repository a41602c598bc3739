"""llama.cpp's own binaries, run one process per prompt (built once per machine by
``.ci/llamacpp_build.sh``; ``dspark bench llamacpp`` and ``tests/interop`` use them).

``DSPARK_LLAMACPP_BIN`` names the build's bin folder; without it the default cache folder of
that script is used when it holds the binaries. Every run is seeded (seed 0), so a greedy
run's output is a function of the files alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DsparkError


class LlamacppError(DsparkError):
    """A llama.cpp binary failed, or its log lacks what a run reports."""


BIN_ENV = "DSPARK_LLAMACPP_BIN"
DEFAULT_BIN = Path.home() / ".cache" / "dspark" / "llama.cpp-0.3.36" / "build" / "bin"
NEEDED = ("llama-speculative-simple", "llama-completion", "llama-tokenize")
BUILD_HINT = "bash .ci/llamacpp_build.sh (builds llama.cpp's CPU binaries once, ~15 min on 2 cores)"
CONTEXT = 2048
TIMEOUT_S = 600
TRIES = 8


def llamacpp_bin() -> Path | None:
    """The folder holding llama.cpp's binaries, or None."""
    env = os.environ.get(BIN_ENV)
    folder = Path(env) if env else DEFAULT_BIN
    return folder if all((folder / b).is_file() for b in NEEDED) else None


def _run(args: list[str], needs: str = "") -> subprocess.CompletedProcess:
    """Run a binary; rerun (up to :data:`TRIES` times) when its log lacks ``needs`` (a regex):
    llama.cpp writes stdout and stderr from one log thread it never joins at exit, so on a
    loaded machine the tail of both is sometimes lost (the note above ``common_log_main`` in
    common/log.cpp). The line looked for is logged last, so once it is there, all is."""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(1.0)
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise LlamacppError(f"{Path(args[0]).name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        if re.search(needs, done.stderr):
            break
    return done


def tokenize(bin_dir: Path, model: Path, text: str) -> list[int]:
    """llama.cpp's token ids of ``text`` (special tokens parsed, as its examples do)."""
    # --no-escape: llama.cpp's tools turn "\\n" in a prompt into a newline unless told not to
    args = ["-m", str(model), "-p", text, "--ids", "--log-disable", "--no-escape"]
    done = _run([str(bin_dir / "llama-tokenize"), *args])
    return [int(x) for x in re.findall(r"-?\d+", done.stdout.strip().splitlines()[-1])]


def _generated(stdout: str, prompt: str) -> str:
    """The text after the echoed prompt."""
    start = stdout.find(prompt)
    if start < 0:
        raise LlamacppError(f"the prompt is not echoed in the output: {stdout[:300]!r}")
    return stdout[start + len(prompt) :]


@dataclass(frozen=True)
class PlainRun:
    """One ``llama-completion`` run: its text and decoding speed (prompt processing excluded)."""

    text: str
    n_decoded: int
    decode_s: float


def plain_run(
    bin_dir: Path, model: Path, prompt: str, max_tokens: int, *, threads: int = 1, temp: float = 0.0
) -> PlainRun:
    """llama.cpp's plain decoding of ``prompt`` (stops at EOS or ``max_tokens``)."""
    done = _run(
        [
            str(bin_dir / "llama-completion"), "-m", str(model), "-p", prompt, "-n", str(max_tokens),
            "--temp", str(temp), "--seed", "0", "-t", str(threads), "-c", str(CONTEXT), "-no-cnv",
            "--simple-io", "--no-display-prompt", "--no-escape",
        ],
        needs=r"\beval time =",
    )  # fmt: skip
    # it ends its output with newlines (and " [end of text]" after EOS): not tokens of the answer
    text = re.sub(r"( \[end of text\])?\n*$", "", done.stdout)
    timing = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", done.stderr)
    if not timing:
        raise LlamacppError(f"no eval time in its log:\n{done.stderr[-2000:]}")
    return PlainRun(text, int(timing.group(2)), float(timing.group(1)) / 1000)


def plain(bin_dir: Path, model: Path, prompt: str, max_tokens: int) -> str:
    """llama.cpp's plain greedy continuation of ``prompt``, one thread."""
    return plain_run(bin_dir, model, prompt, max_tokens).text


@dataclass(frozen=True)
class SpecRun:
    """One ``llama-speculative-simple`` run: its text and counts."""

    text: str
    n_predict: int  # tokens emitted
    n_drafted: int
    n_accept: int
    decode_s: float  # from the first draft to the last token (prompt processing excluded)

    @property
    def rounds(self) -> int:  # target verification steps: each emits its accepted drafts + 1
        return self.n_predict - self.n_accept

    @property
    def tau(self) -> float:
        return self.n_predict / self.rounds


def speculative(
    bin_dir: Path,
    model: Path,
    draft: Path,
    prompt: str,
    max_tokens: int,
    *,
    n_max: int = 7,
    p_min: float = 0.0,
    spec_type: str = "draft-dspark",
    threads: int = 1,
    temp: float = 0.0,
) -> SpecRun:
    """llama.cpp's speculative decoding of ``prompt`` with ``draft`` beside ``model`` (``draft``
    None: a draft-free ``spec_type`` such as ``ngram-simple``, prompt lookup)."""
    model_args = ["-m", str(model)] + (["-md", str(draft)] if draft is not None else [])
    done = _run(
        [
            str(bin_dir / "llama-speculative-simple"), *model_args,
            "--spec-type", spec_type, "--spec-draft-n-max", str(n_max), "--spec-draft-p-min", str(p_min),
            "-p", prompt, "-n", str(max_tokens), "--temp", str(temp), "--seed", "0",
            "-t", str(threads), "-td", str(threads), "-c", str(CONTEXT), "--no-escape",
        ],
        needs=r"n_accept\s*=",
    )  # fmt: skip
    counts = {k: int(v) for k, v in re.findall(r"(n_predict|n_drafted|n_accept)\s*=\s*(\d+)", done.stderr)}
    if len(counts) != 3:
        raise LlamacppError(f"no acceptance counts in its log:\n{done.stderr[-3000:]}")
    decoded = re.search(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", done.stderr)
    text = _generated(done.stdout, prompt)
    return SpecRun(
        text.rstrip("\n"), counts["n_predict"], counts["n_drafted"], counts["n_accept"],
        float(decoded.group(1)) if decoded else float("nan"),
    )  # fmt: skip
