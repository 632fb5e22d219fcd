"""The README's learning curves: `jaxplan train` on the CartPole-v1 preset, then `jaxplan plot`.

Two runs of 3 seeds each, the preset with a constant learning rate (no `lr_schedule`) of
0.0025 (the preset's) and of 0.0005, of `--budget` env steps, written to `runs/curves/`, then
drawn with `jaxplan plot` to `benchmarks/figures/curves.png` (`make figures`).

    python benchmarks/curves.py                       # 150k steps per seed
    python benchmarks/curves.py --budget 50000 --out /tmp/c.png
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "lr-0.0025": ["--config", "lr_schedule=null", "--config", "lr=0.0025"],
    "lr-0.0005": ["--config", "lr_schedule=null", "--config", "lr=0.0005"],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=150_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "curves")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "figures" / "curves.png")
    args = parser.parse_args(argv)
    jaxplan = [sys.executable, "-m", "jaxplan.cli"]
    for name, extra in RUNS.items():
        cmd = [*jaxplan, "train", "ppo", "--env", "CartPole-v1", "--num-seeds", str(args.seeds)]
        cmd += ["--stop-timesteps", str(args.budget), "--quiet", "--output", str(args.runs / name)]
        subprocess.run([*cmd, *extra], check=True)
    dirs = [str(args.runs / name) for name in RUNS]
    cmd = [*jaxplan, "plot", *dirs, "--title", "PPO on CartPole-v1, 3 seeds per run"]
    subprocess.run([*cmd, "-o", str(args.out)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
