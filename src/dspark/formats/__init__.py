"""Drafter files: the folder format (DESIGN §5.4), the shipped drafters and their records, the
target tensors a folder shares, and the exports for other engines (``export/``).

Above the drafter models (it builds them from a folder's config) and below training, the
pipeline and the CLI, which read and write folders.
"""
