"""Pallas kernel for the inter-chunk recurrence of the chunked gated delta rule.

The chunked WY form (`gated_deltanet.chunk_gated_delta_rule`) has a parallel part (per chunk:
decays, the unit-lower-triangular inverse, u and w) and a sequential part: a scan over chunks
carrying the [Dk, Dv] state. As a `lax.scan` each step reads and writes the state through
device memory; this kernel keeps the state on chip for the whole sequence, one program per
(batch, value head, block of value columns: the state's columns evolve independently, so
splitting Dv bounds on-chip memory), like the `chunk_fwd_h`/`chunk_fwd_o` kernels of flash-linear-attention and
the Gated DeltaNet kernels of maxtext / tpu-inference. Same inputs and outputs as the scan, so
the scan is its reference (tests run it in Pallas interpret mode on CPU).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _kernel(u_ref, w_ref, intra_ref, qd_ref, ke_ref, cd_ref, s0_ref, o_ref, s_ref):
    """One (batch, head): refs are [N, C, .] blocks; cd_ref [N, 1]; state [Dk, Dv] in registers."""
    n = u_ref.shape[0]

    def body(j, s_DV):
        u, w = u_ref[j], w_ref[j]
        v_new = u - jnp.dot(w, s_DV, preferred_element_type=jnp.float32)
        o_ref[j] = (jnp.dot(qd_ref[j], s_DV, preferred_element_type=jnp.float32)
                    + jnp.dot(intra_ref[j], v_new, preferred_element_type=jnp.float32)).astype(o_ref.dtype)
        decay = cd_ref[pl.ds(j, 1), :]  # [1, 1]
        return s_DV * decay + jnp.dot(ke_ref[j].T, v_new, preferred_element_type=jnp.float32)

    s_ref[...] = jax.lax.fori_loop(0, n, body, s0_ref[...].astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("interpret", "block_v", "num_stages", "num_warps"))
def chunk_scan_pallas(state_BHDV, u_NBHCV, w_NBHCD, intra_NBHCC, q_decayed_NBHCD, k_to_end_NBHCD,
                      chunk_decay_NBH, interpret: bool = False, block_v: int = 16, num_stages: int = 2,
                      num_warps: int = 8):
    """(final state_BHDV, o_NBHCV): the scan of `chunk_gated_delta_rule`, fused per (batch, head,
    `block_v` value columns).

    Each program holds its whole [N, C, D] sequence blocks; very long sequences on TPU would need
    a chunk-axis grid with the state in scratch memory instead. On GPU (Triton lowering) the loop's
    per-chunk loads are software-pipelined `num_stages` deep in shared memory. Measured on an H200
    at 27B's GDN sizes (48 value heads, Dk = Dv = 128, C = 64, T = 4096; `bench_gdn --sweep`):
    3 stages overflow its 227 KB at every block_v tried; the defaults (16 columns, 2 stages, 8 warps) ran
    the scan 1.04x `lax.scan`, and 32 or 64 columns 0.05-0.10x (register spills).
    """
    n, b, h, c, dv = u_NBHCV.shape
    dk = w_NBHCD.shape[-1]

    def rows(x):  # [N, B, H, ...] -> [B*H, N, ...]
        return jnp.moveaxis(x, 0, 2).reshape(b * h, n, *x.shape[3:])

    args = [rows(x) for x in (u_NBHCV, w_NBHCD, intra_NBHCC, q_decayed_NBHCD, k_to_end_NBHCD)]
    args.append(rows(chunk_decay_NBH)[..., None])
    args.append(state_BHDV.reshape(b * h, dk, dv))

    bv = min(block_v, dv)
    if dv % bv:
        raise ValueError(f"value head dim {dv} is not a multiple of block_v={bv}")

    def spec(x, split_v: bool):  # whole [N, C, D] blocks per row; value-column blocks where split_v
        shape = (None, *x.shape[1:-1], bv if split_v else x.shape[-1])
        return pl.BlockSpec(shape, lambda i, j, nd=x.ndim: (i,) + (0,) * (nd - 2) + (j if split_v else 0,))

    split = (True, False, False, False, False, False, True)  # u, w, intra, qd, ke, decay, state
    gpu = not interpret and jax.default_backend() == "gpu"
    o, s = pl.pallas_call(
        _kernel, grid=(b * h, dv // bv), in_specs=[spec(x, v) for x, v in zip(args, split)],
        out_specs=[spec(args[0], True), spec(args[-1], True)],
        out_shape=[jax.ShapeDtypeStruct((b * h, n, c, dv), jnp.float32),
                   jax.ShapeDtypeStruct((b * h, dk, dv), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages) if gpu else None,
        interpret=interpret)(*args)
    o_NBHCV = jnp.moveaxis(o.reshape(b, h, n, c, dv), 2, 0)
    return s.reshape(b, h, dk, dv), o_NBHCV
