"""The plan stage: every training parameter decided from the data, the machine and the config, with its reason."""
