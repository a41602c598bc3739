"""Training drafters against a frozen target (SPEC §6).

``blocks`` (anchor sampling, block layout, attention masks) and ``losses`` (paper
Eqs. 9-12 and the training metrics) are pure, torch-only modules; drafters read them to
build their training forward and objective. Keep this ``__init__`` free of imports so
that importing those two never pulls in the trainer (or ``torch.distributed``).
"""
