"""Batch-capable drafters for engine tests: each request's drafts depend on that request only.

- :class:`NoisyOracleDrafter` proposes the known greedy continuation with deterministic
  corruptions, so rounds accept long prefixes, reject mid-block, and run into EOS and
  ``max_tokens`` inside blocks. Its confidences depend on the previous draft only (like
  DSpark's Markov-conditioned head): lower after a corrupted draft.
- :class:`SeededRandomDrafter` samples from a fixed random distribution given the previous
  token with a per-request generator seeded from ``SamplingParams.seed``; confidences
  depend on the previous token, so the scheduler's choices depend on drafts.
"""

from __future__ import annotations

import torch

from dspark.protocols import DraftBlock, SamplingParams, SequenceState
from dspark.sampling import process_logits


class NoisyOracleDrafter:
    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab_size: int, error: float = 0.25):
        self.references, self.vocab_size, self.error = references, vocab_size, error

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        R, K = len(states), max_len
        tokens = torch.zeros(R, K, dtype=torch.long)
        conf = torch.zeros(R, K)
        for r, s in enumerate(states):
            prompt = tuple(s.token_ids[: s.prompt_len])
            done = len(s.token_ids) - s.prompt_len
            # Deterministic in (prompt, progress): the same drafts alone or in any batch.
            g = torch.Generator().manual_seed(hash((prompt, done)) % 2**31)
            truth = self.references.get(prompt, [])[done : done + K]
            prev_bad = False
            for k in range(K):
                bad = k >= len(truth) or float(torch.rand((), generator=g)) < self.error
                tokens[r, k] = int(torch.randint(3, self.vocab_size, (), generator=g)) if bad else truth[k]
                conf[r, k] = 0.3 if prev_bad else 0.9  # depends on draft k-1 only
                prev_bad = bad
        probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return DraftBlock(tokens=tokens, lengths=torch.full((R,), K), probs=probs, confidences=conf)

    def update(self, state, num_accepted, new_features) -> None:
        pass


class SeededRandomDrafter:
    target_layer_ids: tuple[int, ...] = ()

    def __init__(
        self, vocab_size: int, seed: int = 0, sharpness: float = 2.0, confident: tuple[int, ...] = ()
    ):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(vocab_size, vocab_size, generator=g) * sharpness  # [V, V]
        # c_k is high when the previous token is in ``confident`` (or for every token if empty)
        self.confident = set(confident)

    def _generator(self, state: SequenceState, params: SamplingParams) -> torch.Generator:
        if state.drafter_cache is None:
            seed = params.seed if params.seed is not None else 1000 + state.request_id
            state.drafter_cache = torch.Generator().manual_seed(seed)
        return state.drafter_cache

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        R, V, K = len(states), self.logits.shape[0], max_len
        tokens = torch.zeros(R, K, dtype=torch.long)
        probs = torch.zeros(R, K, V)
        conf = torch.zeros(R, K)
        for r, (state, params) in enumerate(zip(states, sampling)):
            g = self._generator(state, params)
            prev = state.token_ids[-1]
            for k in range(K):
                conf[r, k] = 0.9 if (not self.confident or prev in self.confident) else 0.05
                p = process_logits(self.logits[prev], params)
                prev = int(torch.multinomial(p, 1, generator=g))
                tokens[r, k], probs[r, k] = prev, p
        return DraftBlock(tokens=tokens, lengths=torch.full((R,), K), probs=probs, confidences=conf)

    def update(self, state, num_accepted, new_features) -> None:
        pass


class TargetDrafter:
    """Drafts position 1 from the target's own distribution (always accepted), later ones uniformly.

    Confidences follow paper Appendix A: ``c_1 = 0.8``; ``c_2`` high when ``x_1`` is in
    ``favoured`` and 0 otherwise, so a scheduler that looks at ``c_2`` before deciding on
    ``x_1`` would favour those tokens.
    """

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, target, favoured: set[int], seed: int = 0) -> None:
        self.target, self.favoured = target, favoured
        self._p_t: dict[tuple[int, ...], torch.Tensor] = {}

    def _target_probs(self, ids: list[int], params: SamplingParams) -> torch.Tensor:
        key = tuple(ids)
        if key not in self._p_t:
            with torch.no_grad():
                logits = self.target.model(torch.tensor([ids])).logits[0, -1]
            self._p_t[key] = process_logits(logits, params)
        return self._p_t[key]

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        R, K = len(states), max_len
        V = self.target.vocab_size
        tokens = torch.zeros(R, K, dtype=torch.long)
        probs = torch.full((R, K, V), 1.0 / V)
        conf = torch.zeros(R, K)
        for r, (state, params) in enumerate(zip(states, sampling)):
            if state.drafter_cache is None:
                state.drafter_cache = torch.Generator().manual_seed(params.seed or 0)
            g = state.drafter_cache
            if K == 0:
                continue
            probs[r, 0] = self._target_probs(state.token_ids, params)
            tokens[r] = torch.multinomial(probs[r], 1, generator=g).squeeze(-1)
            conf[r, 0] = 0.8
            if K > 1:
                conf[r, 1] = 0.9 if int(tokens[r, 0]) in self.favoured else 0.0
        return DraftBlock(tokens=tokens, lengths=torch.full((R,), K), probs=probs, confidences=conf)

    def update(self, state, num_accepted, new_features) -> None:
        pass
