"""The train stage: the model with LoRA, the loss, the Trainer's wiring, what the machine measures while it trains."""
