"""Strips outputs, execution counts and metadata noise from notebooks, in place.

    python notebooks/strip.py [NOTEBOOK.ipynb ...]   # default: every notebooks/*.ipynb

Kept: each cell's source, id and `tags` (the `parameters` cell), and the notebook's
kernelspec / language name. tests/test_notebooks.py fails on anything else.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import nbformat

NOTEBOOKS = pathlib.Path(__file__).parent
KEEP_NOTEBOOK_METADATA = {"kernelspec", "language_info"}


def stripped(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` without outputs, execution counts and metadata beyond tags / kernelspec."""
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        cell.metadata = nbformat.NotebookNode({"tags": tags} if tags else {})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.pop("attachments", None)
    meta = {k: v for k, v in nb.metadata.items() if k in KEEP_NOTEBOOK_METADATA}
    if "language_info" in meta:
        meta["language_info"] = {"name": meta["language_info"].get("name", "python")}
    nb.metadata = nbformat.NotebookNode(meta)
    return nb


def strip_file(path: pathlib.Path) -> bool:
    """Strips `path` in place (atomically); True if it changed."""
    text = path.read_text()
    new = nbformat.writes(stripped(nbformat.reads(text, as_version=4))) + "\n"
    if new == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".ipynb.tmp")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)
    return True


if __name__ == "__main__":
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for p in paths:
        if strip_file(p):
            print(f"stripped {p}")
