"""`jaxplan plot`: curves of a real tiny run and of hand-written result.jsonl files, checked
against numbers computed here from the files; legends from the config diff; one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY_PPO

from jaxplan import cli
from jaxplan import plot as jplot

LR = "info.learner.default_policy.learner_stats.cur_lr"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real `jaxplan train`: 2 seeds, 4 iterations, evaluation on iterations 2 and 4."""
    out = tmp_path_factory.mktemp("plot") / "run"
    argv = ["train", "ppo", "--num-seeds", "2", "--stop-iters", "4", "--report-every", "2"]
    argv += ["--no-compile-cache", "--quiet", "--output", str(out)]
    config = {**TINY_PPO, "evaluation_interval": 2, "evaluation_duration": 2}
    for key, value in config.items():
        argv += ["--config", f"{key}={json.dumps(value)}"]
    assert cli.main(argv) == 0
    return out


def _rows(run):
    return [json.loads(line) for line in (run / "result.jsonl").read_text().splitlines()]


def _expected(rows, x, get):
    """Per x, the mean, min and max over seeds, straight from the rows (seeds share x)."""
    by_x = {}
    for r in rows:
        if (v := get(r)) is not None:
            by_x.setdefault(r[x], []).append(v)
    xs = sorted(by_x)
    ys = [by_x[v] for v in xs]
    assert all(len(y) == 2 for y in ys)  # both seeds at every x
    return np.array(xs, float), *(np.array([f(y) for y in ys]) for f in (np.mean, np.min, np.max))


def test_real_run_png_and_plotted_data_equal_the_results(real_run, tmp_path, capsys):
    png = tmp_path / "curve.png"
    argv = ["plot", str(real_run), "-o", str(png), "--size", "5,3", "--dpi", "80"]
    assert cli.main(argv) == 0
    assert "drawn to" in capsys.readouterr().out
    from matplotlib import image

    assert image.imread(png).shape[:2] == (240, 400)  # H x W pixels = 3 x 80, 5 x 80
    assert not [p for p in tmp_path.iterdir() if p != png]  # no temporary file left

    rows = _rows(real_run)
    x, mean, low, high = _expected(rows, "timesteps_total", lambda r: r["episode_reward_mean"])
    assert len(x) == 4
    (curve,) = jplot.load_curves([real_run])
    np.testing.assert_allclose(curve.x, x)
    np.testing.assert_allclose(curve.mean, mean)
    np.testing.assert_allclose(curve.low, low)
    np.testing.assert_allclose(curve.high, high)
    assert curve.label == "PPO on CartPole-v1" and sorted(curve.per_seed) == [0, 1]

    fig = jplot.draw([curve])
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.lines[0].get_xydata(), np.stack([x, mean], 1))
    verts = ax.collections[0].get_paths()[0].vertices  # the min-max band's outline
    for xv, lo, hi in zip(x, low, high, strict=True):
        at = verts[np.isclose(verts[:, 0], xv), 1]
        assert at.min() == pytest.approx(lo) and at.max() == pytest.approx(hi)
    assert ax.get_legend().get_texts()[0].get_text() == "PPO on CartPole-v1 (2 seeds)"
    assert ax.get_title() == "PPO on CartPole-v1" and ax.get_ylabel() == "episode_reward_mean"


def test_nested_keys_and_rows_without_the_key(real_run):
    rows = _rows(real_run)
    # evaluation.* is in the rows of iterations 2 and 4 only: the others are skipped
    get = lambda r: r.get("evaluation", {}).get("episode_reward_mean")
    x, mean, *_ = _expected(rows, "training_iteration", get)
    np.testing.assert_allclose(x, [2, 4])
    (curve,) = jplot.load_curves([real_run], "training_iteration", "evaluation.episode_reward_mean")
    np.testing.assert_allclose(curve.x, x)
    np.testing.assert_allclose(curve.mean, mean)
    get = lambda r: r["info"]["learner"]["default_policy"]["learner_stats"]["cur_lr"]
    x, mean, *_ = _expected(rows, "training_iteration", get)
    (curve,) = jplot.load_curves([real_run], "training_iteration", LR)
    np.testing.assert_allclose(curve.x, [1, 2, 3, 4])
    np.testing.assert_allclose(curve.mean, mean)
    assert mean == pytest.approx(0.0025)  # the CartPole preset's lr until 70k steps
    (curve,) = jplot.load_curves([real_run], "time_total_s")
    times = sorted({r["time_total_s"] for r in rows})
    assert curve.x[0] >= times[0] and curve.x[-1] <= times[-1] and len(curve.x) >= 4


def _write_run(path, rows, config=None):
    path.mkdir(parents=True)
    (path / "result.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        params = {"algorithm": "PPO", "seeds": [0], "config": config}
        (path / "params.json").write_text(json.dumps(params))
    return path


def test_seeds_with_different_x_and_lengths_are_interpolated_on_their_common_range(tmp_path):
    rows = [{"seed": 0, "timesteps_total": t, "episode_reward_mean": t / 10} for t in (0, 10, 20)]
    rows += [{"seed": 0, "timesteps_total": 30, "episode_reward_mean": None}]  # NaN: skipped
    rows += [{"seed": 0, "timesteps_total": 40, "episode_reward_mean": 4.0}]
    rows += [{"seed": 1, "timesteps_total": t, "episode_reward_mean": t} for t in (5, 15, 25)]
    rows += [{"seed": 1, "timesteps_total": 35}]  # no reward key: skipped
    run = _write_run(tmp_path / "a", rows)
    with open(run / "result.jsonl", "a") as f:
        f.write('{"seed": 1, "timesteps_')  # a last line being written: ignored
    (curve,) = jplot.load_curves([run])
    # common range [5, 25]; grid: the points of both inside it
    np.testing.assert_allclose(curve.x, [5, 10, 15, 20, 25])
    s0 = np.array([0.5, 1.0, 1.5, 2.0, 2.5])  # seed 0 is y = x / 10
    s1 = np.array([5.0, 10.0, 15.0, 20.0, 25.0])  # seed 1 interpolated linearly: y = x
    np.testing.assert_allclose(curve.mean, (s0 + s1) / 2)
    np.testing.assert_allclose(curve.low, s0)
    np.testing.assert_allclose(curve.high, s1)
    np.testing.assert_allclose(curve.per_seed[0][0], [0, 10, 20, 40])
    assert curve.label == "a"  # no params.json: the folder name


def test_legends_are_the_config_keys_that_differ(tmp_path):
    base = {"env": "CartPole-v1", "lr": 0.001, "model": {"fcnet_hiddens": [64, 64]}}
    row = [{"seed": 0, "timesteps_total": 1, "episode_reward_mean": 1.0}]
    a = _write_run(tmp_path / "a", row, base)
    b = _write_run(tmp_path / "b", row, {**base, "lr": 0.01})
    c = _write_run(tmp_path / "c", row, {**base, "model": {"fcnet_hiddens": [8]}})
    d = _write_run(tmp_path / "d", row)
    assert [k.label for k in jplot.load_curves([a, b])] == ["lr=0.001", "lr=0.01"]
    assert [k.label for k in jplot.load_curves([a, b, c, d])] == [
        "lr=0.001, model.fcnet_hiddens=[64, 64]",
        "lr=0.01, model.fcnet_hiddens=[64, 64]",
        "lr=0.001, model.fcnet_hiddens=[8]",
        "d",
    ]
    e = _write_run(tmp_path / "e", row, base)  # the same config as a: folder names added
    assert [k.label for k in jplot.load_curves([a, e, b])] == [
        "lr=0.001 (a)",
        "lr=0.001 (e)",
        "lr=0.01",
    ]
    f = _write_run(tmp_path / "f", row, {**base, "env": "Acrobot-v1", "gamma": 0.9})
    labels = [k.label for k in jplot.load_curves([a, f])]
    assert labels == ["env=CartPole-v1, gamma=null", "env=Acrobot-v1, gamma=0.9"]
    fig = jplot.draw(jplot.load_curves([a, b]), title="mine")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["lr=0.001 (1 seed)", "lr=0.01 (1 seed)"]
    assert fig.axes[0].get_title() == "mine"
    assert not fig.axes[0].collections  # one seed: no band


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["{tmp}/missing"], "missing: no such folder"),
        (["{tmp}/empty"], "empty: no result.jsonl"),
        (["{tmp}/run", "--y", "cur_lr"], "--y cur_lr: no row of {tmp}/run/result.jsonl has"),
        (["{tmp}/run", "--y", "cur_lr"], f"close key paths: {LR}"),
        (["{tmp}/run", "--y", "episode_reward_maen"], "close key paths: episode_reward_mean"),
        (["{tmp}/run", "--x", "steps"], "argument --x: invalid choice: 'steps'"),
        (["{tmp}/run", "--size", "5"], "--size 5: expected W,H"),
        (["{tmp}/run", "--dpi", "0"], "--dpi must be in [10, 1000]"),
        (["{tmp}/run", "-o", "{tmp}/c.gif"], "the format comes from the suffix"),
        (["{tmp}/run", "-o", "{tmp}/no/c.png"], "no such folder"),
        (["{tmp}/run"], "required: -o"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, capsys, args, fragment):
    (tmp_path / "empty").mkdir()
    row = {"seed": 0, "timesteps_total": 1, "episode_reward_mean": 1.0}
    _write_run(
        tmp_path / "run",
        [{**row, "info": {"learner": {"default_policy": {"learner_stats": {"cur_lr": 0.1}}}}}],
    )
    argv = ["plot", *(a.format(tmp=tmp_path) for a in args)]
    if "-o" not in args and "required" not in fragment:  # else a valid -o
        argv += ["-o", str(tmp_path / "c.png")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert not (tmp_path / "c.png").exists()


def test_import_jaxplan_does_not_import_matplotlib():
    code = "import sys, jaxplan, jaxplan.plot, jaxplan.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-500:]
