"""The pipeline: regenerate → cache → train → calibrate → evaluate → report, as resumable stages.

``stages.py`` is the stage machinery both orchestrators share (a stage's record written last
means done; shared stages run by several processes at once). ``presets.py`` holds every
preset's numbers in one table (``PRESETS``): ``quickstart/`` runs the stages on the embedded
tiny target in one command (``tiny_fast``, ``tiny``); ``campaign/`` runs them to convergence
for a target (``tiny_converged``, ``smollm2_converged``), with learning-rate sweeps and plateau
stops.
``calibrate.py`` is the calibration pipeline (decode held-out prompts, fit STS, write the
temperatures) and ``sweeps.py`` the paper's ablations that train small drafters; both train or
decode, so they sit here, above training and evaluation, not in ``calibration/`` or ``eval/``.
"""
