"""One adapter over any HF causal LM: the target as the rest of dspark sees it (DESIGN §4).

It exposes the pieces drafters share with the target (``embed``, ``final_norm``,
``lm_head``), a forward over new tokens on a KV cache that can be rolled back to the
accepted length, and the raw outputs of the chosen decoder layers (``target_layer_ids``)
that feature-conditioned drafters read.

Layer ids: ``-1`` is the embedding output (HF ``hidden_states[0]``), ``i`` the output of
decoder layer ``i`` (HF ``hidden_states[i + 1]``). The last layer is not allowed: HF's
last hidden state is the final-normed one, not the layer's raw output.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from dspark.errors import DsparkError
from dspark.targets.cache import TargetCache
from dspark.targets.families import FamilyLayout, FamilyQuirks, layout_for, module_at, quirks_for

logger = logging.getLogger(__name__)

EMBEDDING_LAYER_ID = -1


class TargetLoadError(DsparkError, ValueError):
    """The target could not be loaded: missing path, not a model folder, bad weights."""


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """``min(5, n - 1)`` feature layers spread evenly, as DeepSpec picks them (DESIGN §4).

    DeepSpec's Qwen3-4B choice ``[1, 9, 17, 25, 33]`` of 36 layers spans layers 1 to
    n - 3 in equal steps. Small targets widen that span (up to layer n - 2, then down to
    layer 0) until it holds enough distinct layers; the final layer is never chosen.
    """
    k = min(5, num_layers - 1)
    if k <= 0:
        return ()
    lo, hi = 1, num_layers - 3
    if hi - lo + 1 < k:
        hi = min(num_layers - 2, lo + k - 1)
    if hi - lo + 1 < k:
        lo = max(0, hi - k + 1)
    if k == 1:
        return (lo,)
    step = (hi - lo) / (k - 1)  # >= 1, so the rounded ids are distinct
    return tuple(lo + round(i * step) for i in range(k))


def validate_layer_ids(layer_ids, num_layers: int) -> tuple[int, ...]:
    """Check feature layer ids: distinct, in ``[-1, num_layers - 2]`` (``()``: no features).

    Any order loads (a folder says which layers it fuses, in its order); new drafters
    get ascending ids (:func:`parse_layer_ids`), the order the engines concatenate in.
    """
    ids = tuple(int(i) for i in layer_ids)
    bad = [i for i in ids if not EMBEDDING_LAYER_ID <= i <= num_layers - 2]
    if bad:
        raise ValueError(
            f"target_layer_ids {bad} out of range: allowed -1 (embeddings) .. {num_layers - 2} "
            f"(the final layer {num_layers - 1} is excluded, HF only exposes it normed)"
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"target_layer_ids has duplicates: {ids}")
    return ids


def check_new_layer_ids(layer_ids, num_layers: int) -> tuple[int, ...]:
    """Layer ids for a new drafter: :func:`validate_layer_ids`, and ascending (the order
    vLLM and SGLang concatenate the target's layers in). Raises ``ValueError``."""
    ids = validate_layer_ids(layer_ids, num_layers)
    if not ids:
        raise ValueError("target_layer_ids is empty: a feature-conditioned drafter reads at least one layer")
    if list(ids) != sorted(ids):
        raise ValueError(f"target_layer_ids must be ascending, got {list(ids)}")
    return ids


def parse_layer_ids(text: str, num_layers: int) -> tuple[int, ...]:
    """``"1,9,17"`` → ``(1, 9, 17)``, checked for a new drafter on ``num_layers``; a one-line error else."""
    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DsparkError(
            f"--target-layers {text!r}: expected comma-separated integers like 1,9,17"
        ) from None
    try:
        return check_new_layer_ids(ids, num_layers)
    except ValueError as e:
        raise DsparkError(f"--target-layers {text!r}: {e}") from None


@dataclass(frozen=True)
class TargetOutput:
    """What one target forward over T new tokens returns."""

    logits: Tensor  # [B, T, V] fp32, softcapped where the family does it
    features: Tensor | None  # [B, T, L, H] raw outputs of layer_ids; None if not asked or L = 0
    hidden: Tensor  # [B, T, H] last hidden state after the final norm
    layer_ids: tuple[int, ...] = ()  # the layers of ``features``, in order (() without features)


class TargetAdapter:
    """A frozen HF causal LM behind the interface of DESIGN §4.

    Works on the model's own modules (embedding, decoder layers, final norm, LM head)
    at the paths its family's row of :mod:`dspark.targets.families` gives; an
    unsupported model type is a one-line :class:`~dspark.errors.UnsupportedTargetError`.
    """

    def __init__(self, model: PreTrainedModel, tokenizer=None, *, target_layer_ids=None) -> None:
        # The target is frozen (DESIGN §2): no dropout, no gradients.
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config.get_text_config()
        self.quirks: FamilyQuirks = quirks_for(self.config)
        # Where the pieces live is table data (families.py), never guessed.
        self.layout: FamilyLayout = layout_for(self.config)
        self._decoder = module_at(model, self.layout.decoder)  # the base model: embeddings, layers, norm
        self._layers: nn.ModuleList = module_at(model, self.layout.layers)
        self._norm: nn.Module = module_at(model, self.layout.final_norm)
        self._embedding: nn.Module = module_at(model, self.layout.embedding)
        self._head: nn.Module = module_at(model, self.layout.lm_head)
        # transformers 5.x renamed the cache kwarg ``past_key_values`` -> ``cache``.
        params = inspect.signature(self._decoder.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

        self.num_layers: int = len(self._layers)
        self.hidden_size: int = self.config.hidden_size
        self.vocab_size: int = self._head.weight.shape[0]
        self.max_context: int = self.config.max_position_embeddings
        self.target_layer_ids: tuple[int, ...] = (
            default_layer_ids(self.num_layers)
            if target_layer_ids is None
            else validate_layer_ids(target_layer_ids, self.num_layers)
        )
        self._checked_layers: set[tuple[int, ...]] = set()  # other layer lists validated once
        self.eos_token_ids: tuple[int, ...] = _eos_token_ids(model, tokenizer)
        self._check_embed_scale()

    def with_layers(self, layer_ids: Sequence[int]) -> TargetAdapter:
        """This target (the same model, shared) with ``layer_ids`` as its default feature layers."""
        other = copy.copy(self)
        other.target_layer_ids = validate_layer_ids(layer_ids, self.num_layers)
        other._checked_layers = set(self._checked_layers)
        return other

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        trust_remote_code: bool = False,
        target_layer_ids=None,
    ) -> TargetAdapter:
        """Load a target (model + tokenizer) from a local HF folder or a hub id.

        ``device`` defaults to CUDA when there is one, else the CPU; ``dtype`` to bf16 on
        CUDA and fp32 on the CPU (the tests' exact-parity dtype), so every command that
        loads a target runs a Qwen3-8B on a GPU box without extra flags.
        Safetensors only; ``trust_remote_code`` stays off unless asked (DESIGN §4).
        Raises :class:`TargetLoadError` when there is no loadable model there.
        """
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        source = str(name_or_path)
        local = Path(source).expanduser()
        # A hub id is "name" or "org/name"; anything else names a local folder.
        if local.is_absolute() or source.startswith((".", "~")) or local.exists():
            if not local.is_dir():
                raise TargetLoadError(f"cannot load target {source!r}: no such folder")
            if not (local / "config.json").is_file():
                raise TargetLoadError(f"cannot load target {source!r}: not a model folder (no config.json)")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code
            )
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:  # HF raises these for missing / invalid repos and files
            where = "local folder" if local.exists() else "hub model (or its cache, when offline)"
            raise TargetLoadError(f"cannot load target {source!r} as a {where}: {e}") from e
        except Exception as e:  # a malformed config.json fails anywhere in HF (TypeError, ZeroDivisionError)
            logger.debug("loading the target failed", exc_info=True)
            reason = (str(e).strip().splitlines() or [""])[0]
            raise TargetLoadError(
                f"cannot load target {source!r}: its config or files are malformed "
                f"({type(e).__name__}: {reason})"
            ) from e
        # Prompt length is checked against the engine's context with a one-line error of our
        # own; the tokenizer's "sequence length is longer than ..." warning would precede it.
        warned = getattr(tokenizer, "deprecation_warnings", {})
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
        return cls(model.to(device), tokenizer, target_layer_ids=target_layer_ids)

    # -- properties -------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self._head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._head.weight.dtype

    # -- the pieces drafters share ----------------------------------------------------

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings as the target's first layer sees them: ``[...] -> [..., H]``.

        Uses the model's own embedding module, which in transformers 5.x already applies
        Gemma's sqrt(H) scale (``quirks.embed_scale``, checked at construction).
        """
        return self._embedding(ids)

    def final_norm(self, h: Tensor) -> Tensor:
        """The target's final norm: ``[..., H] -> [..., H]``."""
        return self._norm(h)

    def lm_head(self, h: Tensor) -> Tensor:
        """Logits from final-normed hidden states: ``[..., H] -> [..., V]`` fp32.

        Applies the family's final logit softcapping ``c * tanh(logits / c)`` (Gemma2).
        """
        logits = self._head(h).float()
        cap = self.quirks.final_logit_softcapping
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        return logits

    # -- forward with a rollback-able cache -------------------------------------------

    def new_cache(self) -> TargetCache:
        return TargetCache()

    @torch.no_grad()
    def forward(
        self,
        ids: Tensor,
        cache: TargetCache,
        *,
        with_features: bool = True,
        layer_ids: Sequence[int] | None = None,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> TargetOutput:
        """Run the target over new tokens ``ids`` [B, T]; positions continue from ``cache.length``.

        Appends the tokens' keys/values to ``cache``. Returns logits at every new
        position (the verification forward of DESIGN §3 needs all γ + 1 of them), and with
        ``with_features`` the raw outputs of ``layer_ids`` — the caller's drafter's
        ``target_layer_ids``; ``None`` means the adapter's default :attr:`target_layer_ids`.
        The layers are an argument, never state changed by whoever loads a drafter.

        A token tree (``sampling/tree.py``) passes its own ``positions [B, T]`` (context
        length + depth) and ``attention_mask [B, 1, T, cache.length + T]`` bool (True: may
        attend; each node sees the context and its ancestors); None: consecutive and causal.
        """
        assert ids.dim() == 2 and ids.dtype == torch.long, (
            f"ids must be [B, T] long, got {ids.dtype} {ids.shape}"
        )
        B, T = ids.shape
        assert T > 0, "forward needs at least one new token"
        if cache.length + T > self.max_context:
            raise ValueError(f"context {cache.length + T} exceeds the target's max {self.max_context}")
        ids = ids.to(self.device)
        if positions is None:
            positions = torch.arange(cache.length, cache.length + T).expand(B, T)  # [B, T]
        mask = {}
        if attention_mask is not None:  # additive, as both the eager and the SDPA attention read it
            assert attention_mask.shape == (B, 1, T, cache.length + T), tuple(attention_mask.shape)
            blocked = torch.finfo(self.dtype).min
            additive = torch.zeros(attention_mask.shape, dtype=self.dtype, device=self.device)
            mask["attention_mask"] = additive.masked_fill(~attention_mask.to(self.device), blocked)

        layers = self.feature_layers(layer_ids) if with_features else ()
        captured: dict[int, Tensor] = {}
        hooks = self._capture_features(captured, layers)
        try:
            out = self._decoder(
                input_ids=ids,
                position_ids=positions.to(self.device),
                use_cache=True,
                **mask,
                **{self._cache_kwarg: cache.kv},
            )
        finally:
            for handle in hooks:
                handle.remove()
        cache.advance(B, T)

        hidden = out.last_hidden_state  # [B, T, H], final-normed by the decoder
        features = None
        if layers:
            features = torch.stack([captured[i] for i in layers], dim=2)  # [B, T, L, H]
        return TargetOutput(logits=self.lm_head(hidden), features=features, hidden=hidden, layer_ids=layers)

    def rollback(self, cache: TargetCache, length: int) -> None:
        """Keep the first ``length`` cached tokens (the accepted prefix); no recomputation."""
        cache.truncate(length)

    # -- internals --------------------------------------------------------------------

    def feature_layers(self, layer_ids: Sequence[int] | None) -> tuple[int, ...]:
        """``layer_ids`` checked against this target (``None``: the adapter's default)."""
        if layer_ids is None:
            return self.target_layer_ids
        layers = tuple(layer_ids)
        if layers != self.target_layer_ids and layers not in self._checked_layers:
            self._checked_layers.add(validate_layer_ids(layers, self.num_layers))
        return layers

    def _capture_features(self, captured: dict[int, Tensor], layer_ids: Sequence[int]) -> list:
        """Hook ``layer_ids`` so one forward records their raw outputs into ``captured``.

        Hooks rather than ``output_hidden_states=True``: HF 5.x collects hidden states
        with hooks too, so neither costs extra compute, but HF keeps all n + 1 states
        alive until the forward ends while we keep L. Measured on CPU, 1 thread, Qwen3
        12 layers H = 256 after a 256-token prefill (median ms, hooks / all hidden
        states / no features): T = 8: 15.8 / 15.0 / 15.3; T = 128: 53 / 60 / 63, i.e.
        within noise, so the choice is about memory and reading exactly the raw outputs.
        Hooks live for one forward only, so the model stays a plain HF model.
        """
        handles = []
        for layer_id in layer_ids:
            if layer_id == EMBEDDING_LAYER_ID:
                # The input of layer 0 is the embedding output exactly as the model uses
                # it (scale included), whichever module applies the scale.
                def pre_hook(module, args, kwargs, layer_id=layer_id):
                    captured[layer_id] = args[0] if args else kwargs["hidden_states"]

                handles.append(self._layers[0].register_forward_pre_hook(pre_hook, with_kwargs=True))
            else:

                def hook(module, args, output, layer_id=layer_id):
                    # Decoder layers return the hidden state, or a tuple led by it (older HF).
                    captured[layer_id] = output[0] if isinstance(output, tuple) else output

                handles.append(self._layers[layer_id].register_forward_hook(hook))
        return handles

    def _check_embed_scale(self) -> None:
        """Fail loudly if ``quirks.embed_scale`` disagrees with the model's embedding module.

        Drafters that hold the bare embedding matrix rely on the quirk; a wrong table
        entry would silently feed them mis-scaled inputs.
        """
        probe = torch.arange(min(4, self.vocab_size), device=self.device)
        with torch.no_grad():
            expected = self._embedding.weight[probe] * self.quirks.embed_scale
            actual = self._embedding(probe)
        if not torch.allclose(actual.float(), expected.float(), rtol=1e-2, atol=1e-6):
            raise ValueError(
                f"embedding scale of family {self.quirks.family!r} is not {self.quirks.embed_scale}: "
                "add the family to dspark.targets.families"
            )


def _eos_token_ids(model: PreTrainedModel, tokenizer) -> tuple[int, ...]:
    """EOS ids from the generation config, the model config and the tokenizer, deduplicated.

    Chat models often end turns with a token other than the tokenizer's EOS (Qwen3's
    ``<|im_end|>``) that only the generation config lists.
    """
    sources = [
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config.get_text_config(), "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ]
    ids: list[int] = []
    for value in sources:
        for i in value if isinstance(value, list | tuple) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)
