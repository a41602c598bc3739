"""Training drafters against a frozen target (DESIGN §6): the trainer, online target
features, chat-template data, checkpoints, metrics, and ``distributed`` — the only
module that imports ``torch.distributed``. What a drafter learns (block layout,
masks, the losses of paper Eqs. 9-12) belongs to the drafter: ``dspark.drafters.blocks``
and ``dspark.drafters.objective``.
"""
