"""Rollouts: tokenizers, chat encoding, the JAX sampler, policies, the episode runner, datasets, metrics."""
from trsi_jax.rollout.chat import Encoded, encode_chat, encode_prompt, generation_prompt
from trsi_jax.rollout.dataset import SCHEMA_VERSION, load_episodes, save_episodes
from trsi_jax.rollout.episodes import OUTCOMES, Budgets, Episode, run_episodes
from trsi_jax.rollout.metrics import pass_at_k, summarize
from trsi_jax.rollout.policy import ModelPolicy, Policy, Reply, ScriptedPolicy
from trsi_jax.rollout.sampler import SampleConfig, Sampler
from trsi_jax.rollout.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["Encoded", "encode_chat", "encode_prompt", "generation_prompt", "SCHEMA_VERSION", "load_episodes",
           "save_episodes", "OUTCOMES", "Budgets", "Episode", "run_episodes", "pass_at_k", "summarize",
           "ModelPolicy", "Policy", "Reply", "ScriptedPolicy", "SampleConfig", "Sampler", "ByteTokenizer",
           "HFTokenizer", "Tokenizer", "load_tokenizer"]
