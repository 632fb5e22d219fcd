"""gymnax is imported without its plotting stack, which still loads when used."""

import subprocess
import sys

CODE = """
import sys
from jaxplan.envs import Env
Env("CartPole-v1")
print("scipy.stats" in sys.modules, type(sys.modules["seaborn"]).__name__)
import seaborn
palette = seaborn.color_palette("cubehelix", 3)
print(len(palette), type(sys.modules["seaborn"]).__name__)
"""


def test_plotting_modules_are_deferred_until_used():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "_Deferred", "3", "module"]
