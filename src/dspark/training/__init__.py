"""Training drafters against a frozen target (DESIGN §6): the trainer, online target
features, chat-template data, checkpoints, metrics, the losses of paper Eqs. 9-12
(``objective``, ``chunked_objective``), and ``distributed`` — the only module that imports
``torch.distributed``. What a drafter's forward consumes stays with the drafters: the block
layout and masks (``dspark.drafters.blocks``) and the objective's coefficients in its config
(``dspark.drafters.objective_config``).
"""
