"""Which input fills a parallel drafter's block slots after the anchor (DESIGN §5.1).

DFlash and DSpark feed the anchor and then ``γ - 1`` mask inputs. Qwen3's tokenizer has
a mask token; most others (Llama, Mistral, Phi, SmolLM2) have none. Two choices:

- **an existing token** (``--mask-token TOKEN`` or an id): its frozen embedding row is
  the mask input. Exports anywhere: DeepSpec's layout (and vLLM / SGLang) carry it as
  ``mask_token_id``.
- **a learned mask embedding** (``--mask-token learned``): the drafter owns a trainable
  vector ``mask_embedding [H]``, saved in its checkpoint. dspark's own folders carry it;
  DeepSpec's layout has no place for it, so engine exports refuse such a drafter.

Measured on SmolLM2 at equal budget (BENCHMARKS.md), both reach the same τ
within noise, so the default for a tokenizer without a mask token is the one that exports:
its unknown token when it has one that is neither EOS nor padding (SmolLM2:
``<|endoftext|>``); otherwise the user chooses.
"""

from __future__ import annotations

import logging

from dspark.errors import DsparkError

log = logging.getLogger(__name__)

LEARNED_MASK = "learned"


class MaskTokenError(DsparkError, ValueError):
    """No usable mask input for a parallel drafter (a user choice to make)."""


def mask_overrides(choice: str | None, tokenizer, vocab_size: int) -> dict:
    """Drafter config fields for ``--mask-token choice``: ``{}`` (keep), learned, or an id.

    ``choice`` is ``None`` (the tokenizer's mask token, or the default), ``"learned"``,
    a token id, or a token string that the tokenizer holds as one token.
    """
    if choice is None:
        return {}
    if choice == LEARNED_MASK:
        return {"mask_embedding": True, "mask_token_id": None}
    if choice.isdigit():
        mask_id = int(choice)
    else:
        vocab = tokenizer.get_vocab() if tokenizer is not None else {}
        if choice not in vocab:
            raise MaskTokenError(
                f"--mask-token {choice!r} is not a token of the target's tokenizer; "
                f"give an existing token, an id, or {LEARNED_MASK!r}"
            )
        mask_id = int(vocab[choice])
    if not 0 <= mask_id < vocab_size:
        raise MaskTokenError(f"--mask-token id {mask_id} is outside the target vocabulary of {vocab_size}")
    return {"mask_token_id": mask_id, "mask_embedding": False}


def resolve_mask_id(config, target) -> int | None:
    """The mask token id of ``config`` for ``target``; None when the drafter learns its mask."""
    if config.mask_token_id is not None:
        mask_id = int(config.mask_token_id)
    elif getattr(config, "mask_embedding", False):
        return None
    else:
        mask_id = getattr(target.tokenizer, "mask_token_id", None)
        if mask_id is None:
            mask_id = _default_mask_id(target)
        if mask_id is None:
            raise MaskTokenError(
                f"the target's tokenizer ({target.config.model_type}) has no mask token: train with "
                f"--mask-token TOKEN (an existing token) or --mask-token {LEARNED_MASK} "
                "(a trainable mask embedding)"
            )
    if not 0 <= mask_id < target.vocab_size:
        raise MaskTokenError(
            f"mask_token_id {mask_id} is outside the target vocabulary of {target.vocab_size}"
        )
    return mask_id


def _default_mask_id(target) -> int | None:
    """The tokenizer's unknown token, when it is a token of its own (not EOS, not padding)."""
    tok = target.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or unk in target.eos_token_ids or unk == getattr(tok, "pad_token_id", None):
        return None
    log.warning(
        "the tokenizer has no mask token: the drafter's mask input is its unknown token %r (id %d); "
        "--mask-token chooses another",
        tok.unk_token,
        unk,
    )
    return int(unk)
