"""Speed benchmarks: what a drafter does to decoding time, measured on this machine.

``decode_speed`` (batch 1: HF ``generate``, the reference loop, the engine), ``speed_matrix``
(prompt set × drafter × concurrency through the engine), ``round_cost``, ``overhead`` and ``step_costs``
(where a round's and a step's time goes), ``serve_load`` (the server under load: throughput
against per-user speed), ``tree_compare`` (chains against token trees), ``startup``
(``dspark --help`` against the interpreter) and ``llamacpp`` (dspark's drafters inside
llama.cpp's own binaries). The ``dspark bench …`` commands (:mod:`dspark.commands`) wire them
to the command line; evaluation metrics (τ, acceptance, calibration) are :mod:`dspark.eval`'s.
"""
