"""Loggers: progress.csv and TensorBoard event files read back and compared with result.jsonl,
resume and an earlier run's files, custom loggers, bad names."""

import csv
import json
import math
import struct

import pytest
from conftest import TINY_PPO

from jaxplan import cli

TINY = [f"--config={k}={json.dumps(v)}" for k, v in TINY_PPO.items() if k != "model"]
TINY += ["--config=model.fcnet_hiddens=[8]", "--no-compile-cache", "--report-every", "2"]
# evaluation every 2nd iteration: its keys appear first at iteration 2 (the CSV header widens)
TINY += ["--config=evaluation_interval=2", "--config=evaluation_duration=2"]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _leaves(d, prefix=""):
    """Independent flattening: key path -> leaf."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _events(path):
    """The events of one TFRecord file, framing parsed here (length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    data, events, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[i + 12 : i + 12 + n])
        events.append(event)
        i += 12 + n + 4
    assert i == len(data)
    return events


def _tb_scalars(folder):
    """{(step, tag): value} of every event file in `folder`, files in name order."""
    out, steps = {}, []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for e in _events(path):
            if e.HasField("summary"):
                steps.append(e.step)
                for v in e.summary.value:
                    assert (e.step, v.tag) not in out
                    out[e.step, v.tag] = v.tensor.double_val[0]
    return out, steps


def _expected_scalars(rows):
    out = {}
    for r in rows:
        for tag, v in _leaves(r).items():
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, int | float) and v is not None and math.isfinite(v):
                out[r["timesteps_total"], tag] = float(v)
    return out


def _check_csv(path, rows):
    """progress.csv holds exactly `rows` (result.jsonl's), every scalar leaf by key path."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        table = list(reader)
        header = reader.fieldnames
    assert len(header) == len(set(header))
    assert len(table) == len(rows)
    for got, want in zip(table, rows, strict=True):
        leaves = {k: v for k, v in _leaves(want).items() if not isinstance(v, list)}
        assert set(header) >= set(leaves)
        for key in header:
            if key not in leaves or leaves[key] is None:  # missing, or NaN (null in jsonl)
                assert got[key] == "", key
            elif isinstance(leaves[key], str):
                assert got[key] == leaves[key]
            else:
                assert float(got[key]) == float(leaves[key]), key


def test_csv_and_tensorboard_through_a_run_its_resume_and_a_new_run(tmp_path, capsys):
    """One output folder through three runs, in order (one test: each step needs the files the
    one before wrote, whichever pytest-xdist worker runs it): a fresh 2-seed run of 3
    iterations, resumed to 5, then a new run in the same folder."""
    out = tmp_path / "run"
    argv = ["train", "ppo", *TINY, "--num-seeds", "2", "--output", str(out)]
    _first_run(out, argv, capsys)
    _resume(out, capsys)
    _new_run(out, argv, capsys)


def _first_run(out, argv, capsys):
    assert cli.main([*argv, "--stop-iters", "3"]) == 0
    stdout = capsys.readouterr().out
    # not a terminal: plain lines at most every 10 s, so iteration 2 (the first chunk's last)
    # and iteration 3 (the run's last, at the end)
    assert [ln.split()[1] for ln in stdout.splitlines() if ln.startswith("iter")] == ["2", "3"]
    rows = _jsonl(out / "result.jsonl")
    assert [(r["training_iteration"], r["seed"]) for r in rows] == [
        (i, s) for i in (1, 2, 3) for s in (0, 1)
    ]
    assert "evaluation" in rows[2] and "evaluation" not in rows[0]
    _check_csv(out / "progress.csv", rows)
    for seed in (0, 1):
        mine = [r for r in rows if r["seed"] == seed]
        got, steps = _tb_scalars(out / "tb" / f"seed_{seed}")
        assert steps == [r["timesteps_total"] for r in mine]
        assert got == _expected_scalars(mine)
        lr = "info/learner/default_policy/learner_stats/cur_lr"  # a tag is the key path
        assert (
            got[mine[0]["timesteps_total"], lr]
            == mine[0]["info"]["learner"]["default_policy"]["learner_stats"]["cur_lr"]
        )


def _resume(out, capsys):
    assert cli.main(["train", "ppo", "--resume", str(out), "--stop-iters", "5", "--quiet"]) == 0
    assert not [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("iter")]
    rows = _jsonl(out / "result.jsonl")
    assert [r["training_iteration"] for r in rows] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    _check_csv(out / "progress.csv", rows)  # one header, the resumed rows appended
    for seed in (0, 1):
        folder = out / "tb" / f"seed_{seed}"
        assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # a new file per run
        got, steps = _tb_scalars(folder)
        mine = [r for r in rows if r["seed"] == seed]
        assert steps == [r["timesteps_total"] for r in mine]
        assert got == _expected_scalars(mine)


def _new_run(out, argv, capsys):
    """A new run keeps the earlier files (numbered) and json can be off."""
    before = (out / "progress.csv").read_bytes()
    tb_before = sorted(p.name for p in (out / "tb" / "seed_0").iterdir())
    assert cli.main([*argv, "--stop-iters", "1", "--quiet", "--loggers", "csv"]) == 0
    assert "kept the previous run's progress.csv as progress.1.csv" in capsys.readouterr().out
    assert (out / "progress.1.csv").read_bytes() == before
    assert sorted(p.name for p in (out / "tb.1" / "seed_0").iterdir()) == tb_before
    assert (out / "result.1.jsonl").exists()
    assert not (out / "result.jsonl").exists() and not (out / "tb").exists()  # json, tb off
    with open(out / "progress.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["training_iteration"], r["seed"]) for r in table] == [("1", "0"), ("1", "1")]
    assert (out / "checkpoint.msgpack").exists()  # params and checkpoints as always


@pytest.mark.parametrize(
    "names, fragment",
    [
        ("json,tensorbord", "unknown logger 'tensorbord'; valid: json, csv, tensorboard"),
        ("", "unknown logger ''"),
    ],
)
def test_bad_logger_name_is_a_one_line_error(names, fragment, tmp_path, capsys):
    argv = ["train", "ppo", "--output", str(tmp_path / "x"), "--loggers", names]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_runner_callable_and_object_loggers(tmp_path):
    import jaxplan
    from jaxplan.loggers import LoggerError
    from jaxplan.results import finite, read_checkpoint
    from jaxplan.runner import Runner

    with pytest.raises(ValueError, match="unknown logger 'xml'; valid: json, csv, tensorboard"):
        Runner(jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1"), output=tmp_path, loggers=["xml"])

    class Closing:
        def __init__(self):
            self.results, self.flushes, self.closed = [], 0, 0

        def on_result(self, result):
            self.results.append(result)

        def flush(self):
            self.flushes += 1

        def close(self):
            self.closed += 1

    got, obj = [], Closing()
    plan = jaxplan.ppo_plan({**TINY_PPO, "model": {"fcnet_hiddens": [8]}}, env="CartPole-v1")
    stop = jaxplan.Stop(training_iteration=3)
    runner = Runner(
        plan,
        seeds=[0, 1],
        stop=stop,
        chunk=2,
        output=tmp_path / "a",
        loggers=["json", got.append, obj],
    )
    returned = runner.run()
    assert got == returned == obj.results  # one per seed per iteration, as yielded
    assert [json.loads(json.dumps(finite(r))) for r in got] == _jsonl(tmp_path / "a/result.jsonl")
    assert obj.flushes == 2 and obj.closed == 1  # after each chunk; once at the end
    assert not (tmp_path / "a" / "progress.csv").exists()  # only the loggers named

    def broken(result):
        if result["training_iteration"] == 3:
            raise KeyError("wandb")

    runner = Runner(
        plan, seeds=[0], stop=stop, chunk=2, output=tmp_path / "b", loggers=["json", broken]
    )
    with pytest.raises(
        LoggerError,
        match=r"logger .*broken failed on seed 0, iteration 3: "
        r"KeyError: 'wandb' \(the run's files are whole up to this chunk\)",
    ):
        runner.run()
    # the chunk was written before the logger ran: lines and checkpoint agree, the lock is free
    rows = _jsonl(tmp_path / "b/result.jsonl")
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert read_checkpoint(tmp_path / "b")["training_iteration"] == 3
    assert not (tmp_path / "b" / ".lock").exists()
