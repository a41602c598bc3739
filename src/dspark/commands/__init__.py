"""The wiring layer: one module per verb of the ``dspark`` command line.

These modules are the only code that may import from any package (the library packages
import downward only; ``scripts/import_graph.py`` checks it). Each holds an
``add_*_args(parser)`` / ``main_*(args)`` pair; shared argument sets are in
:mod:`~dspark.commands.options`, the resolution of ``--target``, ``--drafter`` and
``--data`` in :mod:`~dspark.commands.loading`. :data:`dspark.cli.COMMANDS` names each
module, so ``dspark VERB`` imports VERB's alone; heavy modules (torch, transformers,
fastapi, matplotlib) are imported inside the ``main_*`` functions only, so that building
a verb's parser, its ``--help`` and its argument errors stay fast.
"""
