"""Progress: the bar's numbers and ETA from synthetic results (a fake clock), and the plain
throttled lines off a terminal."""

import io

import pytest

from jaxplan.progress import Progress, format_eta
from jaxplan.run import Stop


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _results(iterations, seeds, steps=100, reward=lambda it, seed: 10.0 * it + seed):
    """One chunk's results: iteration order, then seed order (as `Runner` yields them)."""
    return [
        {
            "seed": s,
            "training_iteration": it,
            "timesteps_this_iter": steps,
            "timesteps_total": steps * it,
            "episode_reward_mean": reward(it, s),
        }
        for it in iterations
        for s in seeds
    ]


def _last_render(text: str) -> str:
    return text.replace("\n", "\r").split("\r")[-2 if text.endswith(("\r", "\n")) else -1]


def test_format_eta():
    assert [format_eta(x) for x in (0, 8, 83.2, 3725, float("nan"), -1)] == [
        "00:00",
        "00:08",
        "01:23",
        "1:02:05",
        "?",
        "?",
    ]


def test_bar_counts_timesteps_with_sps_reward_seeds_and_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(Stop(timesteps_total=1000), [0, 1], bar=True, file=out, clock=clock)
    clock.t += 2.0  # two iterations of both seeds in 2 s: 400 steps
    p.update(_results([1, 2], [0, 1]), done=[])
    assert (p.total, p.n) == (1000, 200)
    assert p.sps == 200.0  # all seeds' env steps over the chunk's wall time
    assert p.eta == pytest.approx((1000 - 200) * 2.0 / 200)  # 8 s at the pace so far
    assert p.reward == pytest.approx((20 + 21) / 2)
    line = _last_render(out.getvalue())
    assert "200/1.00k steps" in line
    assert "eta 00:08, 200 SPS, reward 20.5, seeds 0/2 done" in line
    # seed 1 stops; the bar follows the seed still running, the reward too
    clock.t += 3.0
    p.update(_results([3], [0, 1]), done=[1])
    p.update(_results([4, 5, 6], [0]), done=[1])  # same instant: the rate is unknown
    assert p.n == 600 and p.reward == 60.0
    assert p.eta == pytest.approx(400 * 5.0 / 600)
    assert "seeds 1/2 done" in _last_render(out.getvalue())
    p.close()


def test_resumed_run_eta_counts_only_this_runs_progress():
    clock = Clock()
    p = Progress(Stop(training_iteration=10), [0], clock=clock, file=io.StringIO())
    assert p.unit == "iters"
    clock.t += 4.0
    p.update(_results([7, 8], [0]))  # resumed after 6 iterations: 2 done in 4 s
    assert (p.total, p.n) == (10, 8)
    assert p.eta == pytest.approx(2 * 4.0 / 2)


def test_iteration_stop_caps_the_timestep_total_and_reward_stop_shows_its_target():
    clock, out = Clock(), io.StringIO()
    stop = Stop(timesteps_total=10_000, training_iteration=5, episode_reward_mean=475)
    p = Progress(stop, [0], bar=True, file=out, clock=clock)
    clock.t += 1.0
    p.update(_results([1], [0]))
    assert p.total == 500  # 5 iterations x 100 steps come first
    assert "eta <=00:04" in p.postfix()  # the reward may stop it sooner
    assert "reward 10.0/475" in p.postfix()
    p.close()
    # only a reward stop: steps counted, no total, no ETA
    out = io.StringIO()
    p = Progress(Stop(episode_reward_mean=475), [0], bar=True, file=out, clock=clock)
    clock.t += 1.0
    p.update(_results([1, 2], [0]))
    assert p.total is None and p.eta != p.eta
    assert "eta" not in p.postfix() and "reward 20.0/475" in p.postfix()
    assert "200 steps" in _last_render(out.getvalue())
    p.close()


def test_plain_lines_are_throttled_and_the_last_one_printed_at_close():
    clock, out = Clock(), io.StringIO()
    p = Progress(Stop(training_iteration=40), [0], every_s=10.0, file=out, clock=clock)
    for chunk in range(8):  # chunks of 5 iterations, 4 s each
        clock.t += 4.0
        p.update(_results(range(5 * chunk + 1, 5 * chunk + 6), [0]))
    p.close()
    lines = out.getvalue().splitlines()
    # the first chunk's last iteration at once, then one per >= 10 s (every 3rd chunk, 12 s
    # apart), and the run's last at close
    assert [int(ln.split()[1]) for ln in lines] == [5, 20, 35, 40]
    assert lines[0].startswith("iter     5  timesteps        500  episode_reward_mean    50.00")
    assert lines[0].endswith("eta 00:28")  # 35 iterations left at 5 per 4 s
    # every_s=0: every iteration; no bar, no tqdm output
    out = io.StringIO()
    p = Progress(Stop(training_iteration=4), [0, 1], every_s=0, file=out, clock=clock)
    clock.t += 1.0
    p.update(_results([1, 2, 3, 4], [0, 1]))
    p.close()
    assert [int(ln.split()[1]) for ln in out.getvalue().splitlines()] == [1, 2, 3, 4]
    assert "\r" not in out.getvalue()
