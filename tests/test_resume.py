"""Exact resume: N iterations, then `--resume`, write the rows one N+M run writes.

The checkpoint is the whole run state (env and actor states, stage state such as async
rollouts' snapshots, episode windows, counters, key; per seed), so the continued run is the
same computation. Compared: every field of every `result.jsonl` row except the wall-clock ones.
Cases: 2 seeds vmapped (bulk_sync), async rollouts (stage state), 4 fake devices (in a
subprocess: `python tests/test_resume.py DIR` runs the three commands there). Refusals: another
config, other seeds, another library version, a missing checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flax import serialization

from jaxplan import cli

WALL_CLOCK = ("time_this_iter_s", "time_total_s", "num_env_steps_sampled_throughput_per_sec")
TINY = [
    "--config",
    "train_batch_size=128",
    "--config",
    "model.fcnet_hiddens=[8]",
    "--config",
    "num_sgd_iter=1",
    "--quiet",
    "--no-compile-cache",
    "--report-every",
    "3",
]


def rows(directory: Path, wall_clock: list | None = None) -> list[dict]:
    out = []
    for line in (directory / "result.jsonl").read_text().splitlines():
        row = json.loads(line)
        if wall_clock is not None:
            wall_clock.append(row["time_total_s"])
        for key in WALL_CLOCK:
            row.pop(key)
        out.append(row)
    return out


def run_three(tmp: Path, extra: list[str]) -> tuple[list[dict], list[dict]]:
    """4 iterations into `tmp/a`, resumed to 7 there; 7 iterations at once into `tmp/b`."""
    a, b = tmp / "a", tmp / "b"
    assert cli.main(["train", "ppo", *TINY, *extra, "--stop-iters", "4", "--output", str(a)]) == 0
    assert cli.main(["train", "ppo", "--resume", str(a), "--stop-iters", "7", *TINY[6:]]) == 0
    assert cli.main(["train", "ppo", *TINY, *extra, "--stop-iters", "7", "--output", str(b)]) == 0
    return rows(a), rows(b)


@pytest.mark.parametrize(
    "extra",
    [["--num-seeds", "2"], ["--config", 'rollout_mode="async"']],
    ids=["two_seeds", "async"],
)
def test_resumed_run_writes_the_rows_of_one_run(tmp_path, extra):
    resumed, whole = run_three(tmp_path, extra)
    seeds = 2 if "--num-seeds" in extra else 1
    times: list[float] = []
    rows(tmp_path / "a", times)
    assert times == sorted(times) and times[-1] > times[4 * seeds - 1]  # goes on after resume
    assert len(whole) == 7 * seeds
    assert [r["training_iteration"] for r in resumed] == [r["training_iteration"] for r in whole]
    assert resumed == whole  # bitwise: floats went through JSON's shortest round-trip repr
    ckpt = serialization.msgpack_restore((tmp_path / "a" / "checkpoint.msgpack").read_bytes())
    if "async" in str(extra):  # the async stage's own state was checkpointed and resumed
        assert "parallel_rollouts" in ckpt["state"]["stages"]


def test_resume_on_four_fake_devices(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, whole = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert len(whole) == 7 and resumed == whole
    params = json.loads((tmp_path / "a" / "params.json").read_text())
    assert params["config"]["num_devices"] == 4


def test_resume_refuses_another_run(tmp_path, capsys):
    a = tmp_path / "a"
    base = ["train", "ppo", *TINY, "--stop-iters", "1"]
    assert cli.main([*base, "--output", str(a)]) == 0
    capsys.readouterr()

    def refused(argv, fragment):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1, err

    resume = ["train", "ppo", "--resume", str(a), "--stop-iters", "2"]
    refused([*resume, "--config", "lr=0.1"], "config.lr: 0.0025 -> 0.1")
    refused([*resume, "--seed", "5"], "seeds: [0] -> [5]")
    refused(["train", "ppo", "--resume", str(tmp_path / "none")], "params.json: cannot read")
    (a / "checkpoint.msgpack").rename(a / "moved.msgpack")
    refused(resume, "no checkpoint at")
    (a / "moved.msgpack").rename(a / "checkpoint.msgpack")
    raw = serialization.msgpack_restore((a / "checkpoint.msgpack").read_bytes())
    (a / "checkpoint.msgpack").write_bytes(
        serialization.msgpack_serialize({**raw, "jaxplan_version": "0.0.1"})
    )
    refused(resume, "written by jaxplan 0.0.1")
    assert len(rows(a)) == 1  # nothing was appended by the refused runs


NEW_MODEL_KEYS = (
    "use_lstm",
    "lstm_cell_size",
    "lstm_cell_type",
    "lstm_use_prev_action",
    "lstm_use_prev_reward",
    "max_seq_len",
)


def as_written_before_recurrent_policies(directory: Path) -> None:
    """Rewrites a run's params.json and checkpoint as jaxplan wrote them before recurrent
    policies: no `model.use_lstm`-family keys, no `ActorState.policy_states` field."""
    params = json.loads((directory / "params.json").read_text())
    for key in NEW_MODEL_KEYS:
        del params["config"]["model"][key]
    (directory / "params.json").write_text(json.dumps(params))
    path = directory / "checkpoint.msgpack"
    raw = serialization.msgpack_restore(path.read_bytes())
    saved = json.loads(raw["params"])
    for key in NEW_MODEL_KEYS:
        del saved["config"]["model"][key]
    assert raw["state"]["actors"].pop("policy_states") == {}
    path.write_bytes(serialization.msgpack_serialize({**raw, "params": json.dumps(saved)}))


def test_a_checkpoint_from_before_new_settings_resumes_and_evaluates(tmp_path, capsys):
    """Settings and state fields added to jaxplan later (here: recurrent policies' model keys
    and `ActorState.policy_states`) do not strand older runs: resumed, the run writes the rows
    of one uninterrupted run; `jaxplan evaluate` loads it; a new key set to a non-default
    value on resume is still refused as another run."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["train", "ppo", *TINY, "--stop-iters", "2", "--output", str(a)]) == 0
    as_written_before_recurrent_policies(a)
    capsys.readouterr()
    resume = ["train", "ppo", "--resume", str(a), "--stop-iters", "3", *TINY[6:]]
    lstm = ["--config", "model.use_lstm=true", "--config", "model.max_seq_len=16"]
    assert cli.main([*resume, *lstm]) == 2
    err = capsys.readouterr().err
    assert "config.model.use_lstm: False -> True" in err and "max_seq_len: 20 -> 16" in err
    assert cli.main(resume) == 0
    assert cli.main(["train", "ppo", *TINY, "--stop-iters", "3", "--output", str(b)]) == 0
    assert rows(a) == rows(b)
    assert cli.main(["evaluate", str(a), "--episodes", "2"]) == 0


if __name__ == "__main__":  # the 4-device case, in a process of its own
    tmp = Path(sys.argv[1])
    devices = ["--num-devices", "4", "--config", "sgd_minibatch_size=32"]
    resumed, whole = run_three(tmp, devices)
