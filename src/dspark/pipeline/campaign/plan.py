"""The campaign presets by target (``PLANS``), as ``dspark campaign --target`` names them.

The plans themselves, with every number, are in :data:`dspark.pipeline.presets.PRESETS`.
"""

from __future__ import annotations

from dspark.pipeline.presets import campaign_plans

PLANS = campaign_plans()
