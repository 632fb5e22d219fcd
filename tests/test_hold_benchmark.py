"""benchmarks/hold.py's per-run summary and curve plot (numpy only, no training)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
hold = pytest.importorskip("hold")


def test_summary_of_a_run_that_reaches_the_target_then_sags():
    t = np.arange(1, 7) * 1000
    r = np.array([np.nan, -300.0, -120.0, -90.0, -80.0, -95.0])
    row = hold.summarize(r, t, target=-100.0)
    # first >= -100 at iteration 3 (4000 steps); lowest from there -95; best -80
    assert row["steps_to_target"] == 4000 and row["min_after"] == -95.0
    assert row["best"] == -80.0 and row["final"] == -95.0
    assert row["holds"] is False  # -95 < -80 - 0.1 * 80 = -88
    row = hold.summarize(np.array([10.0, 30.0, 27.5]), t[:3], target=28.0)
    assert row["steps_to_target"] == 2000 and row["min_after"] == 27.5
    assert row["holds"] is True  # 27.5 >= 30 - 3


def test_summary_of_a_run_that_never_reaches_the_target():
    row = hold.summarize(np.array([np.nan, 5.0, 4.0]), np.array([8, 16, 24]), target=28.0)
    assert row["steps_to_target"] is None and row["min_after"] is None
    assert (row["best"], row["final"], row["holds"]) == (5.0, 4.0, False)
    row = hold.summarize(np.array([np.nan, np.nan]), np.array([8, 16]), target=1.0)
    assert row["best"] is None and row["final"] is None and row["holds"] is None


def test_curves_go_to_json_and_to_a_png(tmp_path):
    t = np.array([100, 200, 300])
    runs = [
        {"path": "vmap", "seed": s, **hold.curve(np.array([np.nan, 1.0 + s, 2.0]), t)}
        for s in range(3)
    ]
    assert runs[1]["curve_timesteps"] == [100, 200, 300]
    assert runs[1]["curve_reward"] == [None, 2.0, 2.0]
    png = tmp_path / "c.png"
    hold.plot(runs, png, "test", target=1.5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000
