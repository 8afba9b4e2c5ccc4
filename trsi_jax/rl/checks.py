"""Eager input validation for the RL math, kept outside the jitted cores so those stay pure.

Every check raises ValueError naming the argument and the offending value/position. Value
checks need concrete arrays; called on tracers (inside an outer jit) they raise and say to
validate the host arrays first and pass validate=False.
"""
from __future__ import annotations

import jax
import numpy as np

MAX_TURN_ID = 2**24  # turn ids travel as float32 inside the scans; exact below this in magnitude


def _host(name: str, x) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{name}: cannot validate a traced array; call the check_* function on the "
                         f"concrete arrays outside jit and pass validate=False inside it")
    return np.asarray(x)


def _where(bad: np.ndarray) -> str:
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} entries, first at index {idx}"


def check_shape(name: str, x, shape: tuple, like: str) -> None:
    if tuple(np.shape(x)) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(np.shape(x))} does not match {like} shape {tuple(shape)}")


def check_ndim(name: str, x, ndim: int, layout: str) -> None:
    if np.ndim(x) != ndim:
        raise ValueError(f"{name}: expected {ndim} dims {layout}, got shape {tuple(np.shape(x))}")


def check_finite(name: str, x) -> None:
    h = _host(name, x)
    if not np.issubdtype(h.dtype, np.number) and h.dtype != np.bool_:
        raise ValueError(f"{name}: expected a numeric array, got dtype {h.dtype}")
    bad = ~np.isfinite(h.astype(np.float64))
    if bad.any():
        raise ValueError(f"{name}: NaN or inf in {_where(bad)}")


def check_binary_mask(name: str, x) -> None:
    h = _host(name, x)
    bad = (h != 0) & (h != 1)
    if bad.any():
        raise ValueError(f"{name}: mask must be 0/1, got values like {h[bad].flat[0]!r} ({_where(bad)})")


def check_int_range(name: str, x, lo: int, hi: int) -> None:
    """Integers in [lo, hi)."""
    h = _host(name, x)
    if not (np.issubdtype(h.dtype, np.integer) or h.dtype == np.bool_):
        raise ValueError(f"{name}: expected an integer array, got dtype {h.dtype}")
    bad = (h < lo) | (h >= hi)
    if bad.any():
        raise ValueError(f"{name}: values must lie in [{lo}, {hi}), got {h[bad].flat[0]} ({_where(bad)})")


def check_scalar_in(name: str, x, lo: float, hi: float, hi_open: bool = False) -> None:
    v = float(_host(name, x))
    ok = lo <= v < hi if hi_open else lo <= v <= hi
    if not ok:
        raise ValueError(f"{name}={v} out of range [{lo}, {hi}{')' if hi_open else ']'}")


def check_advantage_inputs(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, **discounts) -> None:
    """Shapes [B, T] all equal, finite rewards/values, 0/1 mask, integer turn ids (only compared
    for equality; -1 padding is fine), discounts in [0, 1]."""
    check_ndim("rewards", rewards_BT, 2, "[B, T]")
    shape = np.shape(rewards_BT)
    for name, x in (("values", values_BT), ("policy_mask", policy_mask_BT), ("turn_ids", turn_ids_BT)):
        check_shape(name, x, shape, "rewards")
    check_finite("rewards", rewards_BT)
    check_finite("values", values_BT)
    check_binary_mask("policy_mask", policy_mask_BT)
    check_int_range("turn_ids", turn_ids_BT, -MAX_TURN_ID, MAX_TURN_ID)
    for name, x in discounts.items():
        check_scalar_in(name, x, 0.0, 1.0)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} unknown; choose one of {sorted(choices)}")
