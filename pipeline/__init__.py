"""repotune's stages (data, plan, train, evaluate, record, use) and the recipes that run them in order."""

import sys

# Python writes the bytecode of what repotune imports even where PYTHONDONTWRITEBYTECODE (common in
# containers) says not to, as `make` does: otherwise every command compiles torch, transformers and the
# rest anew, most of a command's start-up on a small machine.
sys.dont_write_bytecode = False
