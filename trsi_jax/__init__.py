"""trsi_jax: Terminal-RSI (Recursive Self-Rewrite + Recursive Policy-Refine) in JAX."""
import os

__version__ = "0.1.0"

# XLA:CPU (jaxlib 0.10.2) can deadlock when its concurrency-optimized scheduler runs two
# independent loop-heavy computations (e.g. a policy and a critic forward) in one program on a
# small thread pool: every worker ends up waiting. Turning that scheduler off costs nothing
# measurable here and only affects the CPU backend. Read when the backend starts, so this must
# run before the first computation; we append rather than overwrite the user's flags.
_CPU_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _CPU_FLAG).strip()
