"""DSpark: a DFlash backbone + a sequential head + a confidence head (DESIGN §5.3; paper §3).

Block distribution (paper Eq. 4): ``p_k(v | x_0, x_<k) = softmax(U_k + B_k(x_0, x_<k, ·))``
where ``U_k`` are the backbone's base logits of slot k and ``B_k`` the sequential head's
bias: the Markov head's ``W_1[x_{k-1}] W_2`` (default) or the RNN head's ``W_2ᵀ tanh(o_k)``.
One backbone forward, then a cheap left-to-right loop samples ``x_1..x_K``, each step
conditioned on the token just sampled (``x_0`` = the anchor). The reported draft
distribution ``p_d`` is exactly the processed ``softmax(U_k + B_k)`` the token was drawn
from (DESIGN §3). The confidence head gives ``c_k = σ(wᵀ[h_k; W_1[x_{k-1}]] + b)`` (Eq. 7),
optionally temperature-scaled by the STS temperatures of the config (DESIGN §8).

Training is teacher-forced: the previous token of slot k is the ground-truth token (slot
1 uses the anchor), so all slots are computed in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dspark.drafters.backbone import BackboneDrafter, DFlashBackbone, hold_backbone
from dspark.drafters.blocks import batch_layout, pack_blocks
from dspark.drafters.common import DecoderDims, build_from_target
from dspark.drafters.objective_config import ObjectiveConfig, dspark_objective
from dspark.drafters.request_state import assert_states, draw_drafts
from dspark.drafters.tree import SlotScores, build_trees
from dspark.heads import MARKOV_HEAD_TYPES, ConfidenceHead, build_sequential_head, scale_confidence_logits
from dspark.protocols import DraftBlock, SamplingParams, SequenceState, TrainBatch, TrainOutput
from dspark.sampling.argmax import greedy_tokens
from dspark.sampling.tree import TreeBlock, TreeConfig


@dataclass(frozen=True, kw_only=True)
class DSparkConfig:
    """A DSpark drafter. Field names follow DeepSpec's config.json where one exists (DESIGN §5.4).

    ``markov_rank = 0`` drops the sequential head (the backbone alone, i.e. DFlash with a
    confidence head). ``sts_temperatures[k]`` divides the confidence logit of draft k+1.
    """

    num_layers: int = 5
    block_size: int = 7
    target_layer_ids: tuple[int, ...] | None = None  # None = the target adapter's
    mask_token_id: int | None = None  # None = the tokenizer's mask token (Qwen3: 151669)
    mask_embedding: bool = False  # a trainable mask input instead of a token (drafters/mask.py)
    # q/k-norm in the draft layers. True = DeepSpec's Qwen3 draft layer, the class vLLM and SGLang
    # load whatever the target; None = as the target family has it (Llama: none), dspark-only.
    qk_norm: bool | None = True
    markov_rank: int = 256  # r
    markov_head_type: str = "vanilla"  # "vanilla" (Markov, Eq. 5) | "rnn" (Eq. 6)
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True  # c_k reads W_1[x_{k-1}] besides h_k
    sts_temperatures: tuple[float, ...] | None = None  # fitted by calibration (DESIGN §8)
    draft_vocab_size: int | None = None  # N most frequent training tokens; None = all
    # trained with the prompt's last token as an anchor too (TrainConfig.prompt_end_anchors):
    # then it drafts a request's first round (DrafterTraits.after_prompt)
    prompt_end_anchors: bool = False
    objective: ObjectiveConfig = field(default_factory=dspark_objective)

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.block_size < 1:
            raise ValueError(
                f"num_layers and block_size must be >= 1, got {self.num_layers}, {self.block_size}"
            )
        if self.markov_rank < 0:
            raise ValueError(f"markov_rank must be >= 0, got {self.markov_rank}")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"markov_head_type {self.markov_head_type!r} not in {MARKOV_HEAD_TYPES}")
        if self.sts_temperatures is not None and min(self.sts_temperatures, default=0.0) <= 0:
            raise ValueError(f"sts_temperatures must be > 0, got {self.sts_temperatures}")


class DSparkDrafter(BackboneDrafter, nn.Module):
    """Semi-autoregressive drafter: parallel backbone, sequential sampling loop, confidences.

    It holds a :class:`~dspark.drafters.backbone.DFlashBackbone` (``self.backbone``) whose
    weights keep their own names beside the heads' (``fc.weight``, ``markov_head.*``).
    """

    backbone: DFlashBackbone

    def __init__(self, config: DSparkConfig, dims: DecoderDims) -> None:
        super().__init__()
        hold_backbone(self, config, dims)
        self.config = config
        r = config.markov_rank
        self.markov_head = None
        if r > 0:
            self.markov_head = build_sequential_head(
                config.markov_head_type,
                vocab_size=dims.vocab_size,
                rank=r,
                hidden_size=dims.hidden_size,
                draft_vocab_size=self.lm_head.out_features,
            )
            self.markov_head.reset_parameters(dims.initializer_range)
        self.confidence_head = None
        if config.enable_confidence_head:
            conf_rank = r if config.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(dims.hidden_size, conf_rank)

    @classmethod
    def from_target(cls, target, config: DSparkConfig, *, draft_ids: Tensor | None = None) -> DSparkDrafter:
        """A randomly initialised drafter for ``target`` sharing its (frozen) embedding and LM head
        (``draft_ids``: the reduced draft vocabulary of ``config.draft_vocab_size`` tokens)."""
        return build_from_target(cls, target, config, draft_ids=draft_ids)

    def _confidence_logits(self, h: Tensor, markov_emb: Tensor | None) -> Tensor:
        emb = markov_emb if self.confidence_head.markov_rank else None
        return self.confidence_head.logits(h, emb)

    # -- training ----------------------------------------------------------------------------

    def forward_train(self, batch: TrainBatch) -> TrainOutput:
        """Markov-corrected logits and confidences of every real block ``[1, N, K, ...]``, teacher-forced.

        DESIGN §5.3, §6; the blocks are packed by :meth:`DFlashBackbone.block_hidden_train`.
        """
        blocks = pack_blocks(batch_layout(batch, self.block_size), batch.input_ids.shape[1])
        h = self.backbone.block_hidden_train(batch, blocks).unsqueeze(0)  # [1, N, K, H]
        # Slot k sits at position a + k, whose ground-truth token is x_{k-1} (slot 0: the anchor);
        # slots past the end are invalid, any index will do.
        at = blocks.positions.clamp_max(batch.input_ids.shape[1] - 1)  # [N, K]
        prev = batch.input_ids[blocks.rows.unsqueeze(-1), at].unsqueeze(0)  # [1, N, K]
        low_rank = markov_emb = None
        if self.markov_head is not None:
            # logits = U_k + B_k with B_k = W_2ᵀ u_k (Eq. 4-6): kept factored for the chunked loss
            u, markov_emb = self.markov_head.teacher_forced_factors(prev, h)  # [1, N, K, r] x 2
            low_rank = (u, self.markov_head.markov_w2.weight)
        confidences = None
        if self.confidence_head is not None:
            confidences = torch.sigmoid(self._confidence_logits(h, markov_emb))  # [1, N, K]
        return TrainOutput(
            labels=blocks.labels.unsqueeze(0),
            valid=blocks.valid.unsqueeze(0),
            confidences=confidences,
            factors=self.backbone.slot_factors(h, batch, blocks, low_rank),
        )

    # -- inference ---------------------------------------------------------------------------

    def update(self, state: SequenceState, num_accepted: int, new_features: Tensor | None) -> None:
        """Absorb a verified round (:meth:`DFlashBackbone.update`)."""
        self.backbone.update(state, num_accepted, new_features)

    @torch.no_grad()
    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        """One backbone forward, then sample ``x_1..x_K`` left to right from ``softmax(U_k + B_k)``."""
        assert_states(states, max_len, sampling)
        K = min(max_len, self.block_size)
        R = len(states)
        if K == 0 or R == 0:
            return DraftBlock.empty(R, self.dims.vocab_size)
        backbone = self.backbone
        generators = backbone.prepare(states, sampling)
        h = backbone.block_hidden_infer(states)[:, :K]  # [R, K, H]
        base = backbone.logits(h)  # [R, K, N] fp32 (N = V unless the draft vocabulary is reduced)
        anchors = torch.tensor([s.token_ids[-1] for s in states], device=h.device)  # [R]: x_0
        if all(p.greedy for p in sampling):
            tokens, markov_embs = self._greedy_loop(h, base, anchors)  # target ids
            probs = None  # one-hot at the tokens (protocols.DraftBlock)
        else:
            tokens, markov_embs, probs = self._sampled_loop(h, base, anchors, sampling, generators)
        return DraftBlock(
            tokens=tokens,  # [R, K]
            lengths=torch.full((R,), K, dtype=torch.long, device=h.device),
            probs=probs,  # [R, K, V]
            confidences=self._block_confidences(h, markov_embs),
        )

    def propose_tree(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams], shape: TreeConfig
    ) -> TreeBlock:
        """A token tree per request, at most ``min(max_len, γ)`` deep (``drafters/tree.py``)."""
        return build_trees(self.tree_slots(states, max_len, sampling), shape)

    @torch.no_grad()
    def tree_slots(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> SlotScores:
        """One backbone forward, scored for a token tree (``drafters/tree.py``): base logits
        ``[R, K, N]``, the Markov bias of any node's token, and its STS-scaled confidence."""
        assert_states(states, max_len, sampling)
        if self.markov_head is not None and self.config.markov_head_type != "vanilla":
            raise ValueError(
                "token trees need the Markov head: the RNN head's bias depends on the whole path"
            )
        K = min(max_len, self.block_size)
        generators = self.backbone.prepare(states, sampling)
        h = self.backbone.block_hidden_infer(states)[:, :K]  # [R, K, H]
        anchors = torch.tensor([s.token_ids[-1] for s in states], device=h.device)  # [R]
        head = self.markov_head

        def bias(prev: Tensor) -> Tensor:  # [R, n] -> [R, n, N]: W_1[x] W_2 (Eq. 5)
            return head.markov_w2(head.embed(prev))

        def confidence(k: int, prev: Tensor) -> Tensor:  # [R, n] -> [R, n]: Eq. 7 at slot k, STS
            h_k = h[:, k].unsqueeze(1).expand(*prev.shape, h.shape[-1])  # [R, n, H]
            logits = self._confidence_logits(h_k, head.embed(prev) if head is not None else None).float()
            as_slot_k = logits.unsqueeze(-1).expand(*logits.shape, k + 1)  # [R, n, k+1]: column k is read
            return torch.sigmoid(scale_confidence_logits(as_slot_k, self.config.sts_temperatures)[..., k])

        return SlotScores(
            base=self.backbone.logits(h),
            anchors=anchors,
            bias=bias if head is not None else None,
            confidence=confidence if self.confidence_head is not None else None,
            draft_ids=self.draft_ids,
            sampling=sampling,
            generators=generators,
            vocab_size=self.dims.vocab_size,
        )

    def _greedy_loop(self, h: Tensor, base: Tensor, prev: Tensor) -> tuple[Tensor, Tensor | None]:
        """Greedy drafts ``[R, K]`` and Markov embeddings ``[R, K, r]`` (None without a head).

        Greedy ``p_k`` is one-hot at ``argmax(U_k + B_k)`` (sampling/probs.py), so the loop
        keeps only the argmax: no softmax, no [V] probability rows, no host syncs per step.
        """
        K = h.shape[1]
        if self.markov_head is None:
            return self._to_target(greedy_tokens(base)), None
        tokens, embs = [], []
        state = self.markov_head.initial_state(h.shape[0], h)
        for k in range(K):
            bias, emb, state = self.markov_head.step(prev, h[:, k], state)  # [R, N], [R, r]
            prev = self._to_target(greedy_tokens(base[:, k] + bias.float()))  # [R]: Eq. 4, greedy
            tokens.append(prev)
            embs.append(emb)
        return torch.stack(tokens, dim=-1), torch.stack(embs, dim=1)

    def _sampled_loop(
        self, h: Tensor, base: Tensor, prev: Tensor, sampling: list[SamplingParams], generators
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Drafts ``[R, K]``, Markov embeddings ``[R, K, r]`` and ``p_d [R, K, V]``, one draw a step."""
        K = h.shape[1]
        state = self.markov_head.initial_state(h.shape[0], h) if self.markov_head is not None else None
        tokens, embs, probs = [], [], []
        for k in range(K):
            logits_k = base[:, k]  # [R, V]
            if self.markov_head is not None:
                bias, emb, state = self.markov_head.step(prev, h[:, k], state)
                logits_k = logits_k + bias.float()  # Eq. 4: U_k + B_k
                embs.append(emb)
            # target ids (W_1 and the verifier read those) [R]; p_d [R, V]
            prev, p_k = draw_drafts(logits_k, sampling, generators, self.draft_ids, self.dims.vocab_size)
            tokens.append(prev)
            probs.append(p_k)
        markov_embs = torch.stack(embs, dim=1) if embs else None
        return torch.stack(tokens, dim=-1), markov_embs, torch.stack(probs, dim=1)

    def _to_target(self, ids: Tensor) -> Tensor:
        """Draft ids as target ids (unchanged over the full vocabulary)."""
        return ids if self.draft_ids is None else self.draft_ids[ids]

    def _block_confidences(self, h: Tensor, markov_embs: Tensor | None) -> Tensor | None:
        """``c_k`` of every slot at once (Eq. 7, STS-scaled): ``[R, K]``, None without a head."""
        if self.confidence_head is None:
            return None
        logits = self._confidence_logits(h, markov_embs)  # [R, K]
        return torch.sigmoid(scale_confidence_logits(logits.float(), self.config.sts_temperatures))
