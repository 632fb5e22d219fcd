"""benchmarks/gpu.py runs on CPU at tiny sizes: one process per row, figures that add up, one
markdown table (the GPU session runs the same script at full size)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu.py"


def test_tiny_run_writes_one_consistent_table(tmp_path):
    out, rows_json = tmp_path / "gpu.md", tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--envs", "8", "--no-write"]
        + ["--out", str(out), "--json", str(rows_json)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(rows_json.read_text())
    assert [(r["part"], r["envs"], r["devices"]) for r in rows] == [
        ("envs", 8, 0),
        ("scaling", 16, 1),
        ("scaling", 16, 2),
    ]
    for r in rows:
        assert r["env_steps"] == r["envs"] * 16 * 2  # fragment 16, 2 iterations (and checked
        assert r["steps_per_s"] == r["env_steps"] / r["run_s"]  # against the run's counters)
        assert r["compile_s"] == r["lower_s"] + r["xla_compile_s"] > 0
        assert r["peak_bytes"] > 0
    assert [r["mesh_size"] for r in rows] == [0, 1, 2]
    one, two = rows[1], rows[2]
    assert one["efficiency"] == 1.0
    assert two["efficiency"] == two["steps_per_s"] / (2 * one["steps_per_s"])
    table = out.read_text().splitlines()
    body = [line for line in table if line.startswith("| envs") or line.startswith("| scaling")]
    assert len(body) == 3
    assert body[0].startswith("| envs | 8 | 1 (no mesh) |")
    assert f"{two['steps_per_s']:,.0f}" in body[2]


def test_an_env_count_that_does_not_split_into_groups_fails_first(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--envs", "12", "--no-write"]
        + ["--out", str(tmp_path / "gpu.md")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "--envs 12: must be a multiple of 8" in proc.stderr
    assert not (tmp_path / "gpu.md").exists()
