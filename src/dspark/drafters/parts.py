"""A drafter that holds a network part under the part's own weight names (DESIGN §5.4).

DSpark and DFlash both hold the DFlash backbone (``drafters/backbone.py``) rather than
inherit from it. Registering the backbone as a submodule would rename every weight
(``backbone.fc.weight``), breaking the shipped drafters, DeepSpec-compatible exports and
the training checkpoints of running campaigns, whose optimizer state is keyed by the
names of ``named_parameters`` (torch.distributed resolves them with ``getattr``, so key
hooks on ``state_dict`` alone are not enough). :func:`hold` instead registers the part's
submodules and parameters on the drafter itself, in the part's order: state-dict keys,
parameter names and their order stay exactly those of the part.
"""

from __future__ import annotations

from torch import nn


def hold(owner: nn.Module, name: str, part: nn.Module) -> None:
    """Give ``owner`` the attribute ``name = part`` and register ``part``'s contents as its own.

    Call it first in ``owner.__init__``, right after ``super().__init__()``: the part's
    weights then come first, as when the drafter was the part. ``part`` itself is not a
    submodule (no name prefix). Its parameter table *is* ``owner``'s, so a parameter that
    is replaced on ``owner`` (FSDP2 sharding, ``load_state_dict(assign=True)``) is the one
    the part's methods read; submodules are shared objects, so the same holds for theirs.
    ``owner.train()``/``eval()`` reach the part's submodules but not the part's own
    ``training`` flag, which its methods therefore must not read.
    """
    if owner._parameters or owner._buffers or owner._modules:
        raise ValueError(f"hold {name!r} before registering anything else on {type(owner).__name__}")
    owner.__dict__[name] = part  # a plain attribute: nn.Module.__setattr__ would register it
    owner.__dict__["_parameters"] = part._parameters  # one table (see the docstring)
    # Buffers likewise (a reduced draft vocabulary's ``draft_ids``): same keys.
    owner.__dict__["_buffers"] = part._buffers
    owner.__dict__["_non_persistent_buffers_set"] = part._non_persistent_buffers_set
    for child, module in part.named_children():
        owner.add_module(child, module)
