"""The quickstart notebook's code cells are valid Python (they are run by hand before release)."""

import json
import pathlib

NOTEBOOK = pathlib.Path(__file__).parent.parent / "notebooks" / "quickstart.ipynb"


def test_quickstart_code_cells_compile():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = [("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
    assert len(code) >= 4
    for i, src in enumerate(code):
        compile(src, f"{NOTEBOOK.name}[{i}]", "exec")
