"""Import gymnax without its plotting stack.

gymnax 1.0.1 imports `seaborn` and `matplotlib.pyplot` at module level, for rendering only;
that costs several seconds on every start (scipy.stats comes with seaborn). Until first used,
those two modules are stand-ins that import the real module on the first attribute access, so
rendering still works and a user's own `import seaborn` gets the real module.
"""

from __future__ import annotations

import importlib
import sys
import types

_PLOTTING = ("seaborn", "matplotlib.pyplot")


class _Deferred(types.ModuleType):
    """A module placeholder that becomes the real module on first attribute access."""

    def __getattr__(self, attr: str):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def import_gymnax():
    """`import gymnax` with its plotting modules deferred (see the module docstring)."""
    if "gymnax" not in sys.modules:
        for name in _PLOTTING:
            if name not in sys.modules and importlib.util.find_spec(name.split(".")[0]):
                placeholder = _Deferred(name)
                placeholder.__spec__ = None
                sys.modules[name] = placeholder
    import gymnax

    return gymnax
