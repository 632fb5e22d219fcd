"""benchmarks/compile_profile.py: its reading of XLA's CPU compiler log, on a hand-written log
and on a real cold compile of the fixed-work program (the jaxplan side; CI has no rejax). The
real compile is the alarm for a jaxlib whose log no longer says what the script reads."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from compile_profile import main, run_child, summarize, xla_phases  # noqa: E402

LOG = """\
I1206 15:51:40.333538 2631 cpu_compiler.cc:1] Running HLO passes on [jit_add] for CPU time: 1.3 ms
I1206 15:51:41.580353 2644 cpu_compiler.cc:1] Running HLO passes on [jit_train] for CPU time: 431 ms
I1206 15:51:41.580490 2644 cpu_compiler.cc:1] Compiling: jit_train
I1206 15:51:42.597259 2644 cpu_compiler.cc:1] CpuCompiler - Running LLVM verifier time: 119 us
I1206 15:51:42.597473 2650 cpu_compiler.cc:1] CpuCompiler - Running LLVM verifier time: 153 us
I1206 15:51:42.700000 2651 cpu_compiler.cc:1] CpuCompiler - Running LLVM verifier time: 20 us
I1206 15:51:43.793278 2644 cpu_compiler.cc:1] Compilation finished
I1206 15:51:43.795945 2644 cpu_compiler.cc:1] Compiling [jit_train] for CPU using JIT time: 2.22 s
I1206 15:51:43.800000 2644 cpu_compiler.cc:1] Compiling: jit_other
I1206 15:51:43.810000 2644 cpu_compiler.cc:1] CpuCompiler - Running LLVM verifier time: 9 us
"""


def test_phases_are_read_for_the_named_module_only():
    """Hand-computed from the stamps above: HLO passes 431 ms (XLA's own figure), emission
    from "Compiling: jit_train" to the first verifier run (1.016769 s), LLVM from there to
    "Compilation finished" (1.196019 s), 3 kernels; jit_add's and jit_other's lines ignored."""
    phases = xla_phases(LOG, "jit_train")
    assert phases["hlo_s"] == pytest.approx(0.431)
    assert phases["emit_s"] == pytest.approx(42.597259 - 41.580490)
    assert phases["llvm_s"] == pytest.approx(43.793278 - 42.597259)
    assert phases["kernels"] == 3
    assert xla_phases(LOG, "jit_missing") == {
        "hlo_s": None,
        "emit_s": None,
        "llvm_s": None,
        "kernels": None,
    }


def test_summary_takes_medians_and_the_ratio():
    records = [{"library": "rejax", "total_s": t, "kernels": 200} for t in (2.0, 3.0, 2.5)] + [
        {"library": "jaxplan", "total_s": t, "kernels": 300} for t in (3.0, 3.3, 9.0)
    ]
    rows = {r["phase"]: r for r in summarize(records, ["rejax", "jaxplan"])}
    assert rows["total"]["median_rejax"] == 2.5 and rows["total"]["median_jaxplan"] == 3.3
    assert rows["total"]["ratio"] == pytest.approx(3.3 / 2.5)
    assert rows["kernels"]["ratio"] == pytest.approx(1.5)
    assert rows["trace"]["median_jaxplan"] is None and "ratio" not in rows["trace"]
    assert "ratio_baseline" not in rows["total"]


def test_summary_compares_with_a_baseline_checkout():
    records = [{"library": "jaxplan", "total_s": t, "kernels": 290} for t in (3.0, 3.3)] + [
        {"library": "baseline", "total_s": t, "kernels": 320} for t in (3.5, 4.0, 4.5)
    ]
    rows = {r["phase"]: r for r in summarize(records, ["jaxplan", "baseline"])}
    assert rows["total"]["median_baseline"] == 4.0 and rows["total"]["median_jaxplan"] == 3.15
    assert rows["total"]["ratio_baseline"] == pytest.approx(3.15 / 4.0)
    assert rows["kernels"]["ratio_baseline"] == pytest.approx(290 / 320)
    assert "ratio" not in rows["total"]  # no rejax in these rounds


def test_a_baseline_must_be_a_checkout_with_the_compile_child(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--baseline", str(tmp_path), "--no-write"])
    assert exit_info.value.code == 2
    assert f"--baseline {tmp_path}: no benchmarks/_compile_child.py" in capsys.readouterr().err


def test_a_real_cold_compile_is_read_whole(tmp_path):
    """Two iterations of the fixed-work program (one would be no loop), compiled in a fresh
    process with XLA's dump on: every phase is read, the three XLA phases are most of the
    XLA compile's wall time (what is left: its set-up, the dump's HLO files, the executable's
    loading), and the kernels counted by loop depth in the dump are the ones the log counted."""
    row = run_child(sys.executable, "jaxplan", 2048, dump=str(tmp_path))
    assert row["module"] == "jit_train"
    for phase in ("trace_s", "lower_s", "hlo_s", "emit_s", "llvm_s", "xla_s", "kernels"):
        assert row[phase] is not None and row[phase] > 0, phase
    parts = row["hlo_s"] + row["emit_s"] + row["llvm_s"]
    assert 0.75 * row["xla_s"] <= parts <= row["xla_s"] + 0.05
    assert row["total_s"] == pytest.approx(row["trace_s"] + row["lower_s"] + row["xla_s"])
    assert row["kernels"] > 100  # PPO: init, rollout, GAE, epochs, minibatch steps
    depth = row["kernels_by_depth"]
    assert {"0", "1", "2", "3"} <= set(depth)  # entry, iterations, epochs/steps, minibatches
    assert sum(depth.values()) == pytest.approx(row["kernels"], abs=5)
