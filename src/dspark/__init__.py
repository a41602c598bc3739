"""dspark: lossless speculative decoding — train, evaluate and serve drafters for Hugging Face targets."""

__version__ = "0.1.0"
