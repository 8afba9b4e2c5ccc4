"""Sharding rules, meshes and sharded execution on 8 fake CPU devices."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from trsi_jax import sharding
from trsi_jax.config import MeshConfig, OptimConfig, model_preset
from trsi_jax.models import Critic, Qwen, init_cache
from trsi_jax.train.optim import make_optimizer


def _abstract_mesh(data, fsdp, tensor):
    return AbstractMesh((data, fsdp, tensor), sharding.AXES, axis_types=(AxisType.Auto,) * 3)


def _specs(shardings):
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    return {sharding.path_str(p): s.spec for p, s in flat}


def test_make_mesh_fills_minus_one_and_names_the_mismatch(devices8):
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sharding.make_mesh(MeshConfig(data=1, fsdp=4, tensor=1), devices8[:4]).size == 4
    with pytest.raises(ValueError, match="data\\*fsdp\\*tensor = 4 but there are 8 devices"):
        sharding.make_mesh(MeshConfig(data=1, fsdp=2, tensor=2))
    with pytest.raises(ValueError, match="not divisible by the fixed axes' product 3"):
        sharding.make_mesh(MeshConfig(data=3, fsdp=-1, tensor=1))
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.make_mesh(MeshConfig(data=-1, fsdp=-1, tensor=1))


@pytest.mark.parametrize("preset,mesh_shape", [("qwen3_8_27b", (1, 64, 1)), ("qwen3_8_27b", (2, 16, 8)),
                                               ("qwen3_32b", (1, 32, 8))])
def test_every_big_param_of_the_full_size_models_is_sharded(preset, mesh_shape, caplog):
    """eval_shape only: the 27B (and dense 32B) are never allocated."""
    cfg = model_preset(preset)
    mesh = _abstract_mesh(*mesh_shape)
    for cls in (Qwen, Critic):
        params = nnx.state(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))), nnx.Param)
        with caplog.at_level(logging.WARNING):
            shardings = sharding.param_shardings(params, mesh)  # raises on a replicated big tensor
        specs = _specs(shardings)
        assert len(specs) == len(jax.tree.leaves(params))
        assert not [r for r in caplog.records if "not divisible" in r.getMessage()]
        replicated = [(p, s.shape) for (path, s) in jax.tree_util.tree_flatten_with_path(params)[0]
                      for p in [sharding.path_str(path)] if all(e is None for e in specs[p])]
        assert sum(np.prod(shape) for _, shape in replicated) < 2e6, replicated
    if cfg.arch == "qwen3_5":
        assert specs["model/linear_layers/linear_attn/in_proj_qkv/kernel"] == P(None, "fsdp", "tensor")
        assert specs["model/linear_layers/linear_attn/out_proj/kernel"] == P(None, "tensor", "fsdp")
        assert specs["model/linear_layers/linear_attn/conv1d"] == P(None, None, "tensor")
        assert specs["model/full_layers/self_attn/q_proj/kernel"] == P(None, "fsdp", "tensor")
    assert specs["model/embed_tokens/embedding"] == P("tensor", "fsdp")
    assert specs["model/full_layers/mlp/down_proj/kernel"] == P(None, "tensor", "fsdp")
    assert specs["value_head/kernel"] == P("fsdp", None)


def test_indivisible_axis_falls_back_with_warning_and_big_replicated_tensor_raises(caplog):
    mesh = _abstract_mesh(1, 4, 2)
    small = {"mlp": {"up_proj": {"kernel": jax.ShapeDtypeStruct((6, 8), jnp.float32)}}}
    with caplog.at_level(logging.WARNING):
        specs = _specs(sharding.param_shardings(small, mesh))
    assert specs["mlp/up_proj/kernel"] == P(None, "tensor")
    assert any("mlp/up_proj/kernel dim 6" in r.getMessage() for r in caplog.records)
    big = {"mlp": {"up_proj": {"kernel": jax.ShapeDtypeStruct((1025, 1027), jnp.float32)}}}
    with pytest.raises(ValueError, match=r"mlp/up_proj/kernel \(1025, 1027\)"):
        sharding.param_shardings(big, mesh)
    with pytest.raises(ValueError, match="no sharding rule matches parameter 'mystery/w'"):
        sharding.param_shardings({"mystery": {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}}, mesh)


def test_opt_state_follows_params_and_counts_are_replicated(devices8):
    cfg = model_preset("tiny")
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    params = nnx.state(nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    p_specs = _specs(sharding.param_shardings(params, mesh))
    tx = make_optimizer(OptimConfig(grad_accum=2))  # MultiSteps: moments and accumulated grads
    opt = jax.eval_shape(tx.init, params)
    o_specs = _specs(sharding.opt_state_shardings(opt, params, sharding.param_shardings(params, mesh), mesh))
    followed = 0
    for path, spec in o_specs.items():
        owner = [p for p in p_specs if path.endswith("/" + p)]
        if owner:
            assert spec == p_specs[owner[0]], path
            followed += 1
        else:
            assert spec == P(), path
    assert followed == 3 * len(p_specs)  # mu, nu, acc_grads


def test_shard_batch_splits_rows_and_rejects_indivisible(devices8):
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    tokens = np.arange(8 * 5, dtype=np.int32).reshape(8, 5)
    out = sharding.shard_batch({"tokens": tokens}, mesh)["tokens"]
    assert out.sharding.spec == P(("data", "fsdp"), None)
    assert out.addressable_shards[0].data.shape == (2, 5)
    np.testing.assert_array_equal(np.asarray(out), tokens)
    with pytest.raises(ValueError, match="'tokens' of shape \\(6, 5\\).*data\\*fsdp = 4"):
        sharding.shard_batch({"tokens": tokens[:6]}, mesh)


def test_cache_shardings_place_a_decode_cache(devices8):
    cfg = model_preset("tiny")
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    cache = init_cache(cfg, batch=4, max_len=16)
    specs = sharding.cache_shardings(cache, mesh)
    assert specs.k.spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert specs.state.spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert specs.conv.spec == P(None, ("data", "fsdp"), None, "tensor")
    assert specs.pos.spec == P(("data", "fsdp")) and specs.length.spec == P()
    placed = jax.device_put(cache, specs)
    assert placed.state.addressable_shards[0].data.shape == (cache.state.shape[0], 1, 2, 16, 16)


def _ce_loss(graphdef, params, rest, tokens, mask):
    logits = nnx.merge(graphdef, params, rest)(tokens, mask).astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
    m = mask[:, 1:].astype(jnp.float32)
    return -(logp * m).sum() / m.sum()


@pytest.mark.slow
def test_sharded_forward_and_train_step_equal_unsharded(devices8):
    cfg = model_preset("tiny")
    graphdef, params, rest = nnx.split(Qwen(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.5, momentum=0.9))  # linear in the grads
    opt = tx.init(params)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (8, 24), dtype=np.int32)
    mask = np.ones((8, 24), np.int32)
    mask[:3, :5] = 0  # left padding on some rows

    def forward(p, t, m):
        return nnx.merge(graphdef, p, rest)(t, m)

    def step(p, o, t, m):
        loss, grads = jax.value_and_grad(lambda q: _ce_loss(graphdef, q, rest, t, m))(p)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    ref_logits = jax.jit(forward)(params, tokens, mask)
    ref_params, ref_opt, ref_loss = jax.jit(step)(params, opt, tokens, mask)

    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    p_sh = sharding.param_shardings(params, mesh)
    o_sh = sharding.opt_state_shardings(opt, params, p_sh, mesh)
    b_sh = sharding.batch_sharding(mesh, 2)
    sp, so = jax.device_put(params, p_sh), jax.device_put(opt, o_sh)
    st, sm = sharding.shard_batch((tokens, mask), mesh)
    assert sp["model"]["linear_layers"]["mlp"]["up_proj"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
    replicated = NamedSharding(mesh, P())
    with jax.set_mesh(mesh):  # the model's layout pins (sharding.constrain_batch, ...) apply
        logits = jax.jit(forward, in_shardings=(p_sh, b_sh, b_sh))(sp, st, sm)
        new_p, new_o, loss = jax.jit(step, in_shardings=(p_sh, o_sh, b_sh, b_sh),
                                     out_shardings=(p_sh, o_sh, replicated), donate_argnums=(0, 1))(sp, so, st, sm)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(ref_loss), atol=1e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new_p), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new_o), jax.tree.leaves(ref_opt)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    assert jax.tree.leaves(new_p)[0].sharding == jax.tree.leaves(p_sh)[0]


def test_checkpoint_saved_on_one_mesh_restores_onto_another(devices8, tmp_path):
    from trsi_jax.train.checkpoint import Checkpointer

    cfg = model_preset("tiny")
    params = nnx.state(Qwen(cfg, rngs=nnx.Rngs(1)), nnx.Param)
    mesh_a = sharding.make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    mesh_b = sharding.make_mesh(MeshConfig(data=2, fsdp=1, tensor=4))
    saved = nnx.to_pure_dict(sharding.shard_params(params, mesh_a))
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(3, {"params": saved}, {"note": "mesh a"})
    target_sh = nnx.to_pure_dict(sharding.param_shardings(params, mesh_b))
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), saved, target_sh)
    restored = ckpt.restore(3, items=["params"], targets={"params": target})["params"]
    ckpt.close()
    flat_r = jax.tree_util.tree_flatten_with_path(restored)[0]
    flat_s = dict((sharding.path_str(p), x) for p, x in jax.tree_util.tree_flatten_with_path(saved)[0])
    flat_t = dict((sharding.path_str(p), s) for p, s in jax.tree_util.tree_flatten_with_path(target_sh)[0])
    assert len(flat_r) == len(flat_s)
    for path, x in flat_r:
        name = sharding.path_str(path)
        assert x.sharding == flat_t[name], name
        np.testing.assert_array_equal(np.asarray(x), np.asarray(flat_s[name]))
    up = restored["model"]["linear_layers"]["mlp"]["up_proj"]["kernel"]
    assert up.addressable_shards[0].data.shape == (up.shape[0], up.shape[1], up.shape[2] // 4)


def test_layout_pins_split_activations_by_batch_and_reduce_scatter_weight_grads(devices8):
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    x = jnp.ones((8, 4, 16))
    w = jnp.arange(16 * 32, dtype=jnp.float32).reshape(16, 32) / 512.0
    assert sharding.constrain_batch(x) is x  # no ambient mesh: identity
    assert sharding.gather_weight("mlp/up_proj/kernel", w) is w

    def loss(w, x):
        h = sharding.constrain_batch(x) @ sharding.gather_weight("mlp/up_proj/kernel", w)
        return (h ** 2).sum(), sharding.constrain_batch(h)

    w_sh = NamedSharding(mesh, P("fsdp", "tensor"))
    with jax.set_mesh(mesh):
        (value, h), grad = jax.jit(jax.value_and_grad(loss, has_aux=True),
                                   in_shardings=(w_sh, NamedSharding(mesh, P())))(jax.device_put(w, w_sh), x)
    assert h.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"))), 3)
    assert grad.sharding.is_equivalent_to(w_sh, 2)  # the stored split, not the gathered one
    (ref_value, _), ref_grad = jax.value_and_grad(loss, has_aux=True)(w, x)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref_grad), rtol=1e-5)
