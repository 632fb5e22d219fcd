"""The declared dependency floors are the versions CI tests: every `name>=X` in pyproject.toml
is the `name==X` that constraints.txt pins (and that `make` installs)."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    yield from project["dependencies"]
    for extra in project["optional-dependencies"].values():
        yield from extra


def _pins():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_floor_is_the_pinned_tested_version():
    pins = _pins()
    wrong = []
    for requirement in _requirements():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(>=|==)\s*([0-9][0-9A-Za-z.]*)", requirement)
        assert match, f"{requirement!r}: declare a floor (>=) or a pin (==), nothing else"
        name, _, version = match.groups()
        pinned = pins.get(_normal(name))
        assert pinned is not None, f"{name} has no pin in constraints.txt"
        if version != pinned:
            wrong.append(f"{requirement} (constraints.txt tests {name}=={pinned})")
    assert not wrong, "floors that CI does not test: " + "; ".join(wrong)
