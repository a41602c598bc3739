"""The drafter campaign: from a target to converged, evaluated drafters in one resumable command."""

from dspark.campaign.plan import PLANS, CampaignPlan
from dspark.campaign.plateau import plateaued

__all__ = ["PLANS", "CampaignPlan", "plateaued"]
