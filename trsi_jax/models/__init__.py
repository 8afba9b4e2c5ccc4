"""Qwen3.5-family models in Flax NNX, their decode cache and Hugging Face import/export."""
from trsi_jax.models.cache import Cache, init_cache
from trsi_jax.models.hf_io import config_from_hf, load_hf, save_hf
from trsi_jax.models.qwen import Critic, Qwen

__all__ = ["Cache", "Critic", "Qwen", "config_from_hf", "init_cache", "load_hf", "save_hf"]
