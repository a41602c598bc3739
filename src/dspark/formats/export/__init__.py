"""Export a drafter as a folder that vLLM, SGLang, speculators or DeepSpec code loads (DESIGN §5.4, §14).

Formats (:data:`FORMATS`), each for one consumer:

- ``hf``: our own folder; for DSpark/DFlash DeepSpec's ``Qwen3DSparkModel`` layout.
- ``vllm``: served with ``vllm serve TARGET --speculative-config '{"method": ...}'``
  (``dspark`` for DSpark and DFlash, ``eagle3``).
- ``speculators``: the ``speculators_config`` layout, served with ``vllm serve FOLDER``.
- ``sglang``: ``--speculative-algorithm DSPARK`` (with the STS JSON and SPS table it
  reads) or ``EAGLE3``.

What an engine cannot represent is refused for that format with a one-line error that
names the engine and why (:mod:`~dspark.formats.export.layouts`); nothing is exported
silently wrong. ``tests/interop`` loads every export with vLLM's own loader.
"""

from dspark.formats.export.layouts import ENGINE_OF_FORMAT, FORMATS, LAYOUTS, ExportError
from dspark.formats.export.serve import serve_instructions
from dspark.formats.export.sidecars import SPS_NAME, STS_NAME, read_sps_table
from dspark.formats.export.writer import DTYPES, SERVE_NAME, export_drafter

__all__ = [
    "DTYPES",
    "ENGINE_OF_FORMAT",
    "FORMATS",
    "LAYOUTS",
    "SERVE_NAME",
    "SPS_NAME",
    "STS_NAME",
    "ExportError",
    "export_drafter",
    "read_sps_table",
    "serve_instructions",
]
