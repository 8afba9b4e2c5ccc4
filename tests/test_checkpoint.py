"""Orbax Checkpointer: items + metadata, retention, partial restore onto another mesh, policies."""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from trsi_jax.config import MeshConfig, model_preset
from trsi_jax.sharding import make_mesh
from trsi_jax.train.checkpoint import Checkpointer, restore_policy, save_model


def _items(mesh):
    policy = {"w": jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data"))),
              "b": jnp.arange(3, dtype=jnp.int32)}
    critic = {"head": {"kernel": jnp.linspace(-1, 1, 32).reshape(8, 4)}, "count": jnp.array(7)}
    return policy, critic


def test_save_restore_all_and_retention(tmp_path, devices8):
    mesh = jax.make_mesh((8,), ("data",), devices=devices8)
    policy, critic = _items(mesh)
    ckpt = Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, {"policy": jax.tree.map(lambda x: x + step, policy), "critic": critic},
                  {"note": f"s{step}"})
    assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
    again = Checkpointer(str(tmp_path / "ck"))  # a fresh process would see the same
    out = again.restore()
    assert set(out) == {"policy", "critic", "metadata"}
    assert out["metadata"] == {"note": "s3", "step": 3}
    np.testing.assert_array_equal(out["policy"]["w"], np.arange(64.0).reshape(8, 8) + 3)
    np.testing.assert_array_equal(out["policy"]["b"], np.arange(3) + 3)
    assert isinstance(out["critic"]["head"]["kernel"], np.ndarray)
    assert again.metadata(2)["note"] == "s2"


def test_partial_restore_of_one_item_onto_another_mesh(tmp_path, devices8):
    mesh8 = jax.make_mesh((8,), ("data",), devices=devices8)
    policy, critic = _items(mesh8)
    ckpt = Checkpointer(str(tmp_path / "ck"))
    ckpt.save(5, {"policy": policy, "critic": critic})
    mesh24 = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4), devices=devices8)
    target = {"head": {"kernel": jax.ShapeDtypeStruct((8, 4), jnp.float32,
                                                      sharding=NamedSharding(mesh24, P("fsdp", "tensor")))},
              "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh24, P()))}
    out = Checkpointer(str(tmp_path / "ck")).restore(items=["critic"], targets={"critic": target})
    assert set(out) == {"critic", "metadata"}
    kernel = out["critic"]["head"]["kernel"]
    assert kernel.sharding == NamedSharding(mesh24, P("fsdp", "tensor"))
    assert kernel.addressable_shards[0].data.shape == (4, 1)
    np.testing.assert_array_equal(kernel, np.asarray(critic["head"]["kernel"]))
    assert int(out["critic"]["count"]) == 7


def test_missing_item_and_step_name_the_problem(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ck"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore()
    ckpt.save(1, {"params": {"x": jnp.ones(2)}})
    with pytest.raises(KeyError, match="'critic'"):
        ckpt.restore(items=["critic"])
    with pytest.raises(FileNotFoundError, match="step 9"):
        ckpt.restore(step=9)
    with pytest.raises(ValueError, match="reserved"):
        ckpt.save(2, {"metadata": {"x": jnp.ones(2)}})


def test_interrupted_save_leaves_previous_step(tmp_path):
    """A step folder still being written (Orbax's temporary name) is never taken as latest."""
    ckpt = Checkpointer(str(tmp_path / "ck"))
    ckpt.save(1, {"params": {"x": jnp.ones(2)}})
    os.makedirs(tmp_path / "ck" / "2.orbax-checkpoint-tmp-1234" / "params")
    assert Checkpointer(str(tmp_path / "ck")).latest_step() == 1


@pytest.mark.slow
def test_policy_round_trip_and_reshard(tmp_path, devices8):
    from trsi_jax.models import Qwen

    cfg = model_preset("tiny_qwen3")
    model = Qwen(cfg, rngs=nnx.Rngs(3))
    save_model(str(tmp_path / "pol"), model, step=4, cfg=cfg, metadata={"stage": "rsr1"})
    tokens = jnp.array([[5, 9, 33, 2, 7, 100, 3, 4]])
    mask = jnp.ones_like(tokens)
    want = model(tokens, mask)
    got = restore_policy(str(tmp_path / "pol"), cfg)(tokens, mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2), devices=devices8)
    sharded = restore_policy(str(tmp_path / "pol"), cfg, mesh=mesh)
    specs = {s.sharding.spec for s in jax.tree.leaves(nnx.state(sharded, nnx.Param))}
    assert any("fsdp" in str(s) for s in specs)
    np.testing.assert_allclose(np.asarray(sharded(tokens, mask)), np.asarray(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="hidden_size"):
        restore_policy(str(tmp_path / "pol"), dataclasses.replace(cfg, hidden_size=32))
