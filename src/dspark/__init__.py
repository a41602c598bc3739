"""dspark: lossless speculative decoding — train, evaluate and serve drafters for Hugging Face targets."""

from dspark.threads import prefer_passive_waiting

# Before anything imports torch: OpenMP reads its wait policy once, when torch loads it
# (dspark/threads.py says why passive waiting is the default; a value you set is kept).
prefer_passive_waiting()

__version__ = "0.1.0"
