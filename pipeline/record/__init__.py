"""The record: the run's one writer of MANIFEST.json, an update's lineage, the model card."""
