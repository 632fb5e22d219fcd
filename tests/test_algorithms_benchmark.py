"""benchmarks/algorithms.py at a tiny budget: one algorithm's row has the reported fields."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
algorithms = pytest.importorskip("algorithms")


def test_a_tiny_row():
    row = algorithms.measure("a2c", "CartPole-v1", [0, 1], budget=1024, target=475.0)
    assert row["algorithm"] == "A2C" and row["seeds"] == [0, 1]
    assert row["budget"] == 1024  # 4 iterations of the preset's 256-step batch
    assert row["steps_to_target"] == [None, None]  # random play does not reach 475
    assert len(row["best"]) == len(row["final"]) == 2
    assert row["env_steps_per_s"] > 0 and row["compile_s"] > 0


def test_config_overrides_every_preset():
    """`--config KEY=VALUE` reaches the plan: a 512-step batch fits once in 768 steps (the
    preset's 256-step batch three times)."""
    assert algorithms.config_override("model.conv_filters=[]") == ("model.conv_filters", [])
    assert algorithms.config_override("lr=0.001") == ("lr", 0.001)
    row = algorithms.measure(
        "a2c", "CartPole-v1", [0], budget=768, target=475.0, overrides={"train_batch_size": 512}
    )
    assert row["budget"] == 512 and row["overrides"] == {"train_batch_size": 512}
