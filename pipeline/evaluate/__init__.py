"""The evaluate stage: held-out scores of every system, the repository's past (retrieval, selector, lookup)."""
