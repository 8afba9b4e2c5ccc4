"""trsi_jax: Terminal-RSI (Recursive Self-Rewrite + Recursive Policy-Refine) in JAX."""
__version__ = "0.1.0"
