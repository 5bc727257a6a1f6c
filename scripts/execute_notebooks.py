"""Re-executes notebooks in place so their stored outputs (tables, figures) are current.

Needs the dev extra (``pip install -e '.[dev]'``: nbclient and ipykernel). The test suite does not
use this: it runs the notebooks' code cells at toy sizes without Jupyter (tests/test_notebooks.py).

Usage: python scripts/execute_notebooks.py [notebooks/draft_tuning.ipynb ...]
"""

from __future__ import annotations

import pathlib
import sys
import time


def main(argv=None):
    import nbformat
    from nbclient import NotebookClient

    root = pathlib.Path(__file__).resolve().parents[1]
    paths = [pathlib.Path(a) for a in (argv if argv is not None else sys.argv[1:])] or \
        sorted((root / "notebooks").glob("*.ipynb"))
    for path in paths:
        start = time.perf_counter()
        notebook = nbformat.read(path, as_version=4)
        NotebookClient(notebook, timeout=3600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(notebook, path)
        print(f"{path}: executed in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
