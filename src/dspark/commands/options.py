"""One argument set per concept, shared by every verb that takes it.

``--target`` is defined once here, and so are ``--drafter`` / ``--drafters`` (their help
lists the registered names), the sampling flags, ``--template-kwargs``, ``--threads``,
``--device``, ``--dtype``, ``--block-size`` and ``--no-progress``. Nothing here imports torch: the
parser is built, and ``--help`` printed, before any heavy module is loaded.
"""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import (
    drafter_spec,
    drafter_specs,
    json_object,
    non_negative_float,
    non_negative_int,
    positive_int,
    probability,
    target_spec,
)
from dspark.drafters.registry import available

TARGET_HELP = "HF model folder or hub id (default: the embedded tiny target)"


class Parser(argparse.ArgumentParser):
    """A usage error is one line, ``dspark: error: ...``, like every other error a user can make
    (argparse's default prints the whole usage block first)."""

    def error(self, message: str):
        self.exit(2, f"dspark: error: {message} (see `{self.prog} --help`)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of descriptions and epilogs; appends each option's default.

    Unlike :class:`argparse.ArgumentDefaultsHelpFormatter` it leaves out the defaults
    that say nothing (``None``, ``False``, ``[]``) and those the help already states.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        silent = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if action.option_strings and not silent and "(default:" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def drafter_names(*, with_none: bool = True) -> str:
    """``"none, ngram, dflash, dspark, eagle3"``: the registry's names, for help texts."""
    return ", ".join(n for n in available() if with_none or n != "none")


def add_target(p: argparse.ArgumentParser, *, help: str = TARGET_HELP) -> None:
    p.add_argument("--target", type=target_spec, default=None, help=help)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default=None,
        help="torch device of the target and drafters (default: cuda if present, else cpu)",
    )


def add_dtype(p: argparse.ArgumentParser) -> None:
    """``--dtype``: what the target and drafters decode in (resolved by ``targets/dtype.py``)."""
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="dtype of the target and drafters; auto = bfloat16 on CUDA and on CPUs with native bf16 "
        "(AVX512_BF16, AMX, Arm BF16), else float32. Output is lossless against the target in this dtype",
    )


def add_threads(p: argparse.ArgumentParser, *, help: str = "torch CPU threads") -> None:
    """A subcommand's ``--threads``: overrides the choice ``dspark [--threads N]`` made at start."""
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help=f"{help} (default: as `dspark --threads`: OMP_NUM_THREADS if set, else the free cores)",
    )


def add_drafter(
    p: argparse.ArgumentParser,
    *,
    default: str | None = None,
    purpose: str = "",
    with_none: bool = True,
) -> None:
    """``--drafter NAME_OR_FOLDER``: a registered name or a drafter folder."""
    names = drafter_names(with_none=with_none)
    tail = f"; {purpose}" if purpose else ""
    p.add_argument(
        "--drafter",
        default=default,
        required=default is None,
        type=drafter_spec,
        metavar="NAME_OR_FOLDER",
        help=f"a registered drafter ({names}; the trained ones are shipped for the tiny target) "
        f"or a drafter folder{tail}",
    )


def add_drafters(p: argparse.ArgumentParser, *, default: str | None = None, labels: bool = False) -> None:
    """``--drafters A,B,...``: comma-separated registered names or folders."""
    extra = ", or LABEL=NAME_OR_PATH" if labels else ""
    p.add_argument(
        "--drafters",
        type=drafter_specs,
        default=default,
        required=default is None,
        help=f"comma-separated drafters: registered names ({drafter_names()}), drafter folders{extra}",
    )


def add_sampling(p: argparse.ArgumentParser, *, seed_help: str = "seed for reproducible sampling") -> None:
    """Temperature, top-p, top-k and seed, as the server's request fields (DESIGN §10)."""
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass in (0, 1]")
    p.add_argument(
        "--top-k", type=non_negative_int, default=0, help="keep the k most likely tokens (0 = off)"
    )
    p.add_argument("--seed", type=int, default=None, help=seed_help)


def add_block_size(
    p: argparse.ArgumentParser, *, default: int | None = 7, help: str = "most drafts per request per step (γ)"
) -> None:
    p.add_argument("--block-size", type=positive_int, default=default, help=help)


def add_template_kwargs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--template-kwargs",
        type=json_object,
        default="{}",
        help="JSON passed to the chat template, e.g. '{\"enable_thinking\": false}'; "
        "use the same in regenerate, cache, train and eval (DESIGN §7.4)",
    )


def add_no_progress(p: argparse.ArgumentParser, *, help: str = "no progress bar") -> None:
    p.add_argument("--no-progress", action="store_true", help=help)


def add_payoff(p: argparse.ArgumentParser) -> None:
    """``--no-payoff-control`` / ``--no-proposer-choice``: the speculation controller (DESIGN §9.0)."""
    p.add_argument(
        "--no-payoff-control",
        action="store_true",
        help="draft every round, even where drafting and verification cost more time than the accepted "
        "tokens save (default: each request drafts only while its own history says it pays at the "
        "current batch, probing now and then; lossless either way)",
    )
    p.add_argument(
        "--no-proposer-choice",
        action="store_true",
        help="with a model drafter: never fall back to n-gram prompt lookup (default: each request "
        "drafts with whichever of the two pays for it now, one per round)",
    )


def add_force(p: argparse.ArgumentParser, what: str) -> None:
    """``--force``: overwrite outputs no marker says this command wrote (:mod:`dspark.output_folders`)."""
    p.add_argument(
        "--force",
        action="store_true",
        help=f"overwrite {what} (files of other names are never touched)",
    )
