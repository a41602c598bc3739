"""The optimizer of a run: AdamW over the trainable parameters, in groups (DESIGN §6).

Matrices are weight-decayed, norms and biases are not. With ``head_lr_mult != 1``
(the training recipes) the sequential head's parameters form groups of their own whose
learning rate is ``lr × head_lr_mult``; the schedule scales every group alike. At the
default the groups are the two they always were, so older checkpoints' optimizer
states load unchanged.
"""

from __future__ import annotations

from torch import nn

from dspark.errors import DsparkError

SEQUENTIAL_HEAD = "markov_head."  # DSpark's sequential head, Markov or RNN (drafters/dspark.py)
_WRAPPER = "module."  # DDP's prefix; FSDP2 shards in place and keeps the names


def is_head_parameter(name: str, prefix: str) -> bool:
    """Whether parameter ``name`` of the wrapped model belongs to the drafter's sequential head."""
    return name.removeprefix(_WRAPPER).removeprefix(prefix).startswith(SEQUENTIAL_HEAD)


def param_groups(model: nn.Module, prefix: str, *, weight_decay: float, lr: float, head_lr_mult: float):
    """``(groups, trainable)``: AdamW's parameter groups and every trainable parameter, in model order.

    ``prefix`` is the drafter's name inside ``model`` (``"drafter."``).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise DsparkError("the drafter has no trainable parameters")
    trainable = [p for _, p in named]
    head = [is_head_parameter(n, prefix) for n, _ in named]
    if head_lr_mult == 1.0:
        head = [False] * len(named)  # one rate for all: the two groups of every earlier run
    elif not any(head):
        raise DsparkError(
            f"head_lr_mult {head_lr_mult} needs a drafter with a sequential head (DSpark with "
            "markov_rank > 0); this one has none"
        )
    groups = []
    for in_head, rate in ((False, lr), (True, lr * head_lr_mult)):
        part = [p for (_, p), h in zip(named, head) if h == in_head]
        for decayed in (True, False):
            params = [p for p in part if (p.dim() >= 2) == decayed]  # matrices decay; norms, biases not
            if params or not in_head:  # the body's two groups always exist (checkpoint layout)
                groups.append(
                    {"params": params, "weight_decay": weight_decay if decayed else 0.0, "lr": rate}
                )
    return groups, trainable
