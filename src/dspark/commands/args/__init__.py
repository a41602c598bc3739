"""The light half of every verb: its arguments and its ``--help`` text.

One module per module of :mod:`dspark.commands`, of the same name: ``args/train.py`` holds
``add_train_args(parser)``, whose docstring is ``dspark train --help``'s description, and
``commands/train.py`` holds ``main_train(args)``, which imports what it runs at the top.
These modules import argparse, :mod:`~dspark.commands.argtypes`,
:mod:`~dspark.commands.options` and light tables (the drafter names, the pipeline's presets),
never torch, transformers or a module that loads them: ``dspark VERB --help`` and every
argument error are answered before anything heavy is imported (a test checks).
"""
