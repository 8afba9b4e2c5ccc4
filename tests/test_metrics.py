import math

import numpy as np

from trsi_jax.metrics import MetricsWriter, read_metrics


def test_jsonl_roundtrip_with_arrays_and_nan(tmp_path):
    w = MetricsWriter(str(tmp_path))
    w.write(1, {"loss": np.float32(0.5), "n": 3})
    w.write(2, {"loss": float("nan")})
    w.close()
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["loss"] == 0.5 and rows[0]["n"] == 3
    assert math.isnan(float(rows[1]["loss"]))
    assert any(p.name.startswith("events") for p in (tmp_path / "tb").iterdir())
