"""The notebooks run top to bottom in a real Jupyter kernel, and are committed stripped.

Each notebook is executed unchanged by nbclient in a fresh `python3` kernel (ipykernel's own
kernelspec, i.e. this interpreter: the venv with jaxplan installed) with
`JAXPLAN_NOTEBOOK_SMOKE=1`, which the notebook's `parameters` cell reads to shrink its
budgets. The executed copy stays in memory; the files are never written.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).parent.parent / "notebooks"
NAMES = ["quickstart.ipynb", "plans.ipynb"]
sys.path.insert(0, str(NOTEBOOKS))
from strip import stripped  # noqa: E402


def test_the_kernel_is_this_interpreter():
    """The `python3` kernel starts this interpreter (jupyter_client maps the spec's bare
    `python` to sys.executable), so the executed notebooks see this venv's jaxplan."""
    from jupyter_client import KernelManager

    assert KernelManager(kernel_name="python3").format_kernel_cmd()[0] == sys.executable


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("JAXPLAN_NOTEBOOK_SMOKE", "1")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the notebook sets its own
    monkeypatch.delenv("MPLBACKEND", raising=False)  # inline figures, whatever the shell set
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "JAXPLAN_NOTEBOOK_SMOKE" in params[0].source
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('PREFIX=' + sys.prefix)"))
    client = NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError with the cell and traceback
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    assert nb.cells[-1].outputs[0].text.strip() == "PREFIX=" + sys.prefix  # this venv
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the notebook drew no plot"
    if name == "plans.ipynb":
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "CpuDevice(id=3)" in text, text[:2000]  # the 4 fake devices exist


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_stripped(name):
    """Fails on outputs, execution counts or metadata noise: run `python notebooks/strip.py`."""
    text = (NOTEBOOKS / name).read_text()
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name}: cell {cell.id} has outputs; run `python notebooks/strip.py`"
            )
    clean = nbformat.writes(stripped(nbformat.reads(text, as_version=4))) + "\n"
    assert text == clean, f"{name} is not stripped: run `python notebooks/strip.py`"


def test_strip_removes_outputs_and_noise():
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hi")]
    code.execution_count = 7
    code.metadata["collapsed"] = True
    nb.metadata["widgets"] = {"x": 1}
    out = stripped(nb)
    assert code.outputs == [] and code.execution_count is None and code.metadata == {}
    assert set(out.metadata) == {"kernelspec", "language_info"}
    tagged = [c for c in out.cells if c.metadata.get("tags") == ["parameters"]]
    assert len(tagged) == 1  # the parameters tag survives
