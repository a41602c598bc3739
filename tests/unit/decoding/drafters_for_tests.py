"""Small drafters for loop tests: random proposals, and an oracle that knows the answer."""

from __future__ import annotations

import torch

from dspark.protocols import DraftBlock, SamplingParams, SequenceState
from dspark.sampling import process_logits


class RandomDrafter:
    """Samples each draft from a fixed random distribution given the previous token.

    Its proposals are mostly wrong, so rejection sampling works hard; it reports the
    exact distribution it sampled from (DESIGN §3).
    """

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, vocab_size: int, seed: int = 0, sharpness: float = 2.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(vocab_size, vocab_size, generator=g) * sharpness  # [V, V]
        self.generator = torch.Generator().manual_seed(seed + 1)

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        R, V = len(states), self.logits.shape[0]
        tokens = torch.zeros(R, max_len, dtype=torch.long)
        probs = torch.zeros(R, max_len, V)
        for r, (state, params) in enumerate(zip(states, sampling)):
            prev = state.token_ids[-1]
            for k in range(max_len):
                p = process_logits(self.logits[prev], params)
                prev = int(torch.multinomial(p, 1, generator=self.generator))
                tokens[r, k], probs[r, k] = prev, p
        return DraftBlock(tokens=tokens, lengths=torch.full((R,), max_len), probs=probs)

    def update(self, state: SequenceState, num_accepted: int, new_features: torch.Tensor | None) -> None:
        pass


class OracleDrafter:
    """Proposes a known continuation (e.g. the target's own greedy answer), one-hot."""

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, prompt_len: int, continuation: list[int], vocab_size: int) -> None:
        self.prompt_len, self.continuation, self.vocab_size = prompt_len, continuation, vocab_size

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        done = len(states[0].token_ids) - self.prompt_len
        found = self.continuation[done : done + max_len]
        tokens = torch.zeros(1, max_len, dtype=torch.long)
        tokens[0, : len(found)] = torch.tensor(found, dtype=torch.long)
        probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return DraftBlock(tokens=tokens, lengths=torch.tensor([len(found)]), probs=probs)

    def update(self, state: SequenceState, num_accepted: int, new_features: torch.Tensor | None) -> None:
        pass
