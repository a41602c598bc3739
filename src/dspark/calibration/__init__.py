"""Calibration of the DSpark confidence head (DESIGN §8): rounds with confidences, ECE/AUC/Brier
and reliability, Sequential Temperature Scaling, the static threshold sweep."""
