"""SFT: masked loss vs a NumPy reference, batching, learning, exact resume after a kill, NaN stop."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trsi_jax.config import MeshConfig, OptimConfig, SFTConfig, model_preset
from trsi_jax.models import Qwen
from trsi_jax.sharding import make_mesh
from trsi_jax.train.data import BucketedBatches, SFTExample
from trsi_jax.train.sft import SFTTrainer, sft_loss

CFG = model_preset("tiny_qwen3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _examples(n=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.integers(6, 30, n):
        prompt = int(length) // 3
        out.append(SFTExample(rng.integers(3, 300, length), (np.arange(length) >= prompt).astype(int)))
    return out


def _sft_cfg(**kw):
    base = dict(optim=OptimConfig(lr=1e-2, warmup_steps=1, total_steps=4, grad_accum=2),
                batch_size=4, max_len=32, pad_multiple=16, checkpoint_every=3, log_every=1, eval_every=4)
    base.update(kw)
    return SFTConfig(**base)


def _params(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_loss_matches_numpy_reference_with_shifted_mask():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 5))
    loss_mask = np.array([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    loss, metrics = sft_loss(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(loss_mask))
    total, count = 0.0, 0
    for b in range(2):
        for t in range(1, 5):  # token t is predicted by the logits at t-1
            if loss_mask[b, t]:
                z = logits[b, t - 1].astype(np.float64)
                total += np.log(np.exp(z - z.max()).sum()) + z.max() - z[tokens[b, t]]
                count += 1
    np.testing.assert_allclose(float(loss), total / count, rtol=1e-5)
    assert float(metrics["tokens"]) == count == 6


def test_batches_are_a_pure_function_of_seed_and_step():
    exs = _examples(10)
    a = BucketedBatches(exs, batch_size=4, seed=3, max_len=20, pad_multiple=8)
    b = BucketedBatches(exs, batch_size=4, seed=3, max_len=20, pad_multiple=8)
    for step in (7, 0, 5, 2):  # any access order
        for key in ("tokens_BT", "mask_BT", "loss_mask_BT"):
            np.testing.assert_array_equal(a.batch(step)[key], b.batch(step)[key])
    assert a.steps_per_epoch == 3
    seen = np.concatenate([a.indices(s) for s in range(3)])
    assert set(seen.tolist()) == set(range(10))  # every example once per epoch (2 wrap-around repeats)
    assert not np.array_equal(np.concatenate([a.indices(s) for s in range(3, 6)]), seen)  # new epoch order
    other = BucketedBatches(exs, batch_size=4, seed=4, max_len=20, pad_multiple=8)
    assert any(not np.array_equal(a.indices(s), other.indices(s)) for s in range(3))
    batch = a.batch(1)
    assert batch["tokens_BT"].shape[1] in (8, 16, 20)
    for row, i in enumerate(a.indices(1)):
        n = min(len(exs[i].tokens), 20)
        np.testing.assert_array_equal(batch["tokens_BT"][row, :n], exs[i].tokens[:n])
        np.testing.assert_array_equal(batch["loss_mask_BT"][row, :n], exs[i].loss_mask[:n])
        assert batch["mask_BT"][row].sum() == n and batch["loss_mask_BT"][row, n:].sum() == 0
    assert a.truncated == sum(len(e.tokens) > 20 for e in exs)


def test_eval_batches_count_each_example_once():
    exs = _examples(5)
    batches = BucketedBatches(exs, batch_size=4, seed=0, max_len=32, pad_multiple=8).sequential()
    assert len(batches) == 2
    assert sum(int(b["loss_mask_BT"].sum()) for b in batches) == sum(int(e.loss_mask.sum()) for e in exs)


@pytest.mark.slow
def test_loss_falls_on_tiny_model(tmp_path):
    exs = _examples(4)
    model = Qwen(CFG, rngs=nnx.Rngs(0))
    cfg = _sft_cfg(optim=OptimConfig(lr=1e-2, warmup_steps=2, total_steps=30, schedule="constant"),
                   checkpoint_every=100, eval_every=30)
    result = SFTTrainer(model, cfg, str(tmp_path)).train(exs, exs, progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    first = rows[0]["train/loss"]
    assert result.step == 30 and result.eval_loss < 0.3 * first, (first, result)
    assert (tmp_path / "checkpoints" / "30").is_dir()  # the end of the run is always checkpointed


@pytest.mark.slow
def test_resume_gives_the_parameters_of_an_uninterrupted_run(tmp_path):
    exs = _examples(8)
    cfg = _sft_cfg()  # 8 micro-steps, accumulation over 2, checkpoints at 3 and 6 (mid-accumulation)
    straight = Qwen(CFG, rngs=nnx.Rngs(0))
    SFTTrainer(straight, cfg, str(tmp_path / "a")).train(exs, progress=False)

    SFTTrainer(Qwen(CFG, rngs=nnx.Rngs(0)), cfg, str(tmp_path / "b")).train(exs, stop_after=5, progress=False)
    resumed = Qwen(CFG, rngs=nnx.Rngs(0))  # fresh process state: nothing carried over but the workdir
    result = SFTTrainer(resumed, cfg, str(tmp_path / "b")).train(exs, progress=False)
    assert result.resumed_from == 3 and result.step == 8
    for x, y in zip(_params(straight), _params(resumed)):
        np.testing.assert_array_equal(x, y)
    # Resuming with another data seed is refused rather than silently mixing orders.
    with pytest.raises(ValueError, match="seed"):
        SFTTrainer(Qwen(CFG, rngs=nnx.Rngs(0)), dataclasses.replace(cfg, seed=1), str(tmp_path / "b"))._resume()


def test_nan_loss_stops_with_step_and_writes_no_checkpoint(tmp_path):
    model = Qwen(CFG, rngs=nnx.Rngs(0))
    leaves, treedef = jax.tree.flatten(nnx.state(model, nnx.Param))
    leaves[0] = leaves[0] * jnp.nan
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    with pytest.raises(FloatingPointError, match="SFT step 1: non-finite loss"):
        SFTTrainer(model, _sft_cfg(checkpoint_every=1), str(tmp_path)).train(_examples(4), progress=False)
    assert not (tmp_path / "checkpoints").exists() or not any(
        p.name.isdigit() for p in (tmp_path / "checkpoints").iterdir())


@pytest.mark.slow
def test_sharded_training_matches_single_device(tmp_path, devices8):
    exs = _examples(8)
    cfg = _sft_cfg(optim=OptimConfig(lr=1e-2, warmup_steps=1, total_steps=3), checkpoint_every=100)
    one = Qwen(CFG, rngs=nnx.Rngs(0))
    SFTTrainer(one, cfg, str(tmp_path / "one")).train(exs, progress=False)
    many = Qwen(CFG, rngs=nnx.Rngs(0))
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), devices=devices8)
    SFTTrainer(many, cfg, str(tmp_path / "many"), mesh=mesh).train(exs, progress=False)
    for x, y in zip(_params(one), _params(many)):
        np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5)


_CHILD = """
import sys
from flax import nnx
sys.path.insert(0, {root!r})
from tests.test_sft import CFG, _examples, _sft_cfg
from trsi_jax.config import OptimConfig
from trsi_jax.models import Qwen
from trsi_jax.train.sft import SFTTrainer
cfg = _sft_cfg(optim=OptimConfig(lr=1e-2, warmup_steps=1, total_steps=100), checkpoint_every=2)
SFTTrainer(Qwen(CFG, rngs=nnx.Rngs(0)), cfg, sys.argv[1]).train(_examples(8), progress=False)
"""


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_matches_uninterrupted(tmp_path):
    """A real kill -9 of a training process; the restarted run ends on the same parameters."""
    cfg = _sft_cfg(optim=OptimConfig(lr=1e-2, warmup_steps=1, total_steps=100), checkpoint_every=2)
    work = tmp_path / "killed"
    env = dict(os.environ)  # same devices and compilation cache as this process
    log = open(tmp_path / "child.log", "w")  # a file, not a pipe: a full pipe would stall the child
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=ROOT), str(work)], env=env,
                             cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    ckpts = work / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None:
        if ckpts.is_dir() and any(p.name.isdigit() and int(p.name) >= 4 for p in ckpts.iterdir()):
            break
        time.sleep(0.05)
    assert child.poll() is None, f"child ended before the kill: {(tmp_path / 'child.log').read_text()[-2000:]}"
    child.send_signal(signal.SIGKILL)
    child.wait()
    log.close()
    done = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    assert done and done[-1] < 100, done

    resumed = Qwen(CFG, rngs=nnx.Rngs(0))
    result = SFTTrainer(resumed, cfg, str(work)).train(_examples(8), progress=False)
    assert result.resumed_from == done[-1] and result.step == 100
    straight = Qwen(CFG, rngs=nnx.Rngs(0))
    SFTTrainer(straight, cfg, str(tmp_path / "straight")).train(_examples(8), progress=False)
    for x, y in zip(_params(straight), _params(resumed)):
        np.testing.assert_array_equal(x, y)
