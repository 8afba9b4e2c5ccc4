"""Pallas kernels (GPU/TPU) for the model's sequential parts; pure-JAX references live beside them."""
