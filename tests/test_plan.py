"""The ahead-of-time planner: FLOP counting through scans and memory figures that match XLA's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import plan as plan_lib
from trsi_jax import sharding
from trsi_jax.config import MeshConfig, OptimConfig, model_preset, override
from trsi_jax.models import Qwen


def _chain(w_LDD, x_BD):
    def body(h, w):
        return h @ w, None
    return jax.lax.scan(body, x_BD, w_LDD)[0].sum()


def test_jaxpr_flops_count_every_scan_iteration_where_xla_counts_one():
    w = jax.ShapeDtypeStruct((6, 32, 32), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 32), jnp.float32)
    one = 2 * 8 * 32 * 32
    assert plan_lib.count_flops(_chain, w, x) == 6 * one
    assert plan_lib.count_flops(_chain, w, x, loops_once=True) == one
    xla = jax.jit(_chain).lower(w, x).compile().cost_analysis()["flops"]
    assert one <= xla < 2 * one  # XLA: the body once (plus the final reduction)
    # Gradient: the forward once, then dX and dW for each of the 6 matmuls.
    assert plan_lib.count_flops(jax.grad(_chain), w, x) == (6 + 12) * one


def test_parse_mesh_names_bad_entries():
    assert plan_lib.parse_mesh("data=2,fsdp=16,tensor=4") == MeshConfig(data=2, fsdp=16, tensor=4)
    assert plan_lib.parse_mesh("fsdp=64") == MeshConfig(data=1, fsdp=64, tensor=1)
    with pytest.raises(ValueError, match="bad entry 'expert=2'"):
        plan_lib.parse_mesh("fsdp=4,expert=2")


@pytest.mark.slow
def test_plan_memory_matches_the_compiled_step_and_real_shards(devices8):
    cfg = override(model_preset("tiny"), {"remat": "full"})
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    rows, seq_len = 4, 16
    plan = plan_lib.plan("sft", cfg, OptimConfig(), mesh, rows, seq_len)
    kinds = plan.bytes_by_kind
    # Arguments XLA allocates per device = what the shardings say each piece holds.
    assert sum(kinds.values()) == plan.argument_bytes
    # Parameters and optimizer state are donated: the updated ones are written in place.
    assert plan.alias_bytes == kinds["params"] + kinds["opt"]
    # Real placed parameters hold exactly the planned bytes on device 0.
    placed = sharding.shard_params(nnx.state(Qwen(cfg, rngs=nnx.Rngs(0)), nnx.Param), mesh)
    dev0 = sum(s.data.nbytes for x in jax.tree.leaves(placed) for s in x.addressable_shards
               if s.device == mesh.devices.flat[0])
    assert dev0 == kinds["params"]
    total = sum(x.nbytes for x in jax.tree.leaves(placed))
    assert total / 8 <= dev0 < total / 2  # split 4 ways (fsdp x tensor), norms replicated
    assert kinds["batch"] == 3 * (rows // 4) * seq_len * 4  # 3 int32/fp32 arrays, rows over data*fsdp
    assert plan.temp_bytes > 0 and plan.peak_bytes > plan.argument_bytes
    # FLOPs: without remat the step executes the model FLOPs (3 x forward); full remat adds at most
    # one forward (the backward recomputes only what it needs: 0.69 of it at gdn_chunk_size 32).
    plain = plan_lib.plan("sft", override(cfg, {"remat": "none"}), OptimConfig(), mesh, rows, seq_len)
    assert plain.step_flops == pytest.approx(plain.model_flops, rel=0.01)
    assert plain.step_flops + 0.5 * plan.model_flops / 3 < plan.step_flops <= plain.step_flops + plan.model_flops / 3
    assert plan.model_flops >= plan.analytic_flops  # attention and the vocab head come on top
    assert plan.xla_flops * plan.devices >= 0.9 * plan.flops_loops_once
    fits = plan_lib.format_plan(plan, "v5p", plan_lib.CHIPS["v5p"], "tiny", rows * seq_len)
    assert "fits" in fits and "DOES NOT FIT" not in fits
    small = plan_lib.Chip(peak_tflops=1.0, hbm_gb=plan.peak_bytes / 2 / plan_lib.GB)
    assert "DOES NOT FIT" in plan_lib.format_plan(plan, "tiny-chip", small, "tiny", rows * seq_len)
    assert np.isclose(plan.step_seconds(small), plan.step_flops / 8 / 1e12)


def test_decode_plan_splits_weights_and_cache_and_bounds_by_bandwidth(devices8):
    """Decode plan of the tiny model on data=2 x tensor=4: weight shards cover the model,
    the cache is split by batch, and the bound is bytes per device / bandwidth."""
    from experiments.plan_decode import decode_plan
    from trsi_jax.models import init_cache
    from trsi_jax.sharding import make_mesh

    cfg = override(model_preset("tiny"), {"num_kv_heads": "4"})
    plan = decode_plan(cfg, make_mesh(MeshConfig(data=2, fsdp=1, tensor=4)), batch=4, context=64)
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(
        nnx.state(nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0))), nnx.Param)))
    cache_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(
        jax.eval_shape(lambda: init_cache(cfg, 4, 64))))
    assert param_bytes / 4 <= plan.weight_bytes < param_bytes  # split 4 ways where the rules allow
    assert cache_bytes / 8 <= plan.cache_bytes < cache_bytes / 2 + 1024  # batch over data, heads over tensor
    assert plan.tokens_per_sec_per_chip(1000) == pytest.approx(4 / ((plan.weight_bytes + plan.cache_bytes) / 1e12) / 8)
