"""The drafter campaign: from a target to converged, evaluated drafters in one resumable command."""

from dspark.pipeline.campaign.plateau import plateaued

__all__ = ["plateaued"]
