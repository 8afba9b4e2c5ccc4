"""Training core: optimizer, Orbax checkpoints, SFT trainer."""
