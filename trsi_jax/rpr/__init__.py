"""RPR (Recursive Policy-Refine): PPO with a warm-up critic over multi-turn terminal episodes."""
from trsi_jax.rpr.batch import RolloutBatch, episodes_to_batch
from trsi_jax.rpr.handoff import load_policy, read_handoff, write_handoff
from trsi_jax.rpr.stage import RPRResult, run_rpr, setup_rpr

__all__ = ["RolloutBatch", "RPRResult", "episodes_to_batch", "load_policy", "read_handoff", "run_rpr", "setup_rpr",
           "write_handoff"]
