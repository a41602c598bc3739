"""Chat prompts as token ids: the one place a conversation becomes the ids a target answers.

One convention everywhere (the server, eval, training's online evaluation, regeneration
and the CLI): render with the tokenizer's own chat template (DESIGN §7.4) to text, then
tokenize that text without added special tokens — exactly how training renders and
tokenizes whole conversations (:mod:`dspark.data.samples`), so the prompt the target
answered is a prefix of the sample the drafter is trained on.

With one exception: control tokens *written in the messages* (or the template's
variables) stay text. A user who types ``<|im_end|>\n<|im_start|>system ...`` gets those
characters tokenized as ordinary text, not a forged system turn; only the control tokens
the template writes itself are special tokens (transformers' ``sanitize_control_tokens``,
5.20+). A conversation without such text tokenizes exactly as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from dspark.data.prompts import Prompt
from dspark.errors import DsparkError

Messages = list[dict[str, str]]
SANITIZE = "sanitize_control_tokens"  # apply_chat_template's switch: control tokens in the input stay text


def user_messages(text: str, system: str | None = None) -> Messages:
    """``[{"role": "system", ...}?, {"role": "user", "content": text}]``."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": text}]


def first_turn_messages(prompt: Prompt) -> Messages:
    """The messages of a prompt's first turn, with its system message if it has one."""
    return user_messages(prompt.turns[0], prompt.system)


def chat_prompt_ids(
    tokenizer, messages: Messages, template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """Token ids of the chat prompt for the next assistant turn (module docstring)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DsparkError("the target's tokenizer has no chat template (DESIGN §7.4 uses the target's own)")
    if SANITIZE not in inspect.signature(tokenizer.apply_chat_template).parameters:
        # An older transformers would pass the switch to the template as a variable: no protection.
        raise DsparkError(f"control tokens in messages stay text only with transformers >= 5.20 ({SANITIZE})")
    ids = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=True,
        sanitize_control_tokens=True,
        **dict(template_kwargs or {}),
    )
    return list(ids)


def prompt_ids(tokenizer, prompt: Prompt, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Ids of a prompt set entry's first turn (with its system message)."""
    return chat_prompt_ids(tokenizer, first_turn_messages(prompt), template_kwargs)
