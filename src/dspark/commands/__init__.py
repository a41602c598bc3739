"""The wiring layer: the verbs of the ``dspark`` command line, two modules each.

These modules are the only code that may import from any package (the library packages
import downward only; ``scripts/import_graph.py`` checks it). A verb's arguments and its
``--help`` text are ``args/<module>.py``'s ``add_*_args(parser)``, which imports nothing heavy;
its run is ``<module>.py``'s ``main_*(args)``, which imports the library, torch and the rest at
the top. Shared argument sets are in :mod:`~dspark.commands.options`, the parse-time checks in
:mod:`~dspark.commands.argtypes`, the resolution of ``--target``, ``--drafter`` and ``--data``
in :mod:`~dspark.commands.loading`. :data:`dspark.cli.COMMANDS` names both modules of each
verb, so ``dspark VERB --help`` and its argument errors import the arguments alone, and
``dspark VERB ...`` imports the run once the arguments are parsed.
"""
