"""The package layout reads as the field, and its imports run one way: models <- decoders <-
sampling and theory <- tuning and auditing <- experiments and the CLI (a decoder only describes
its laws; sampling and theory never import each other)."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "specjax"
# _settings (static settings read before any work) sits below _checks, which serves its names.
LAYERS = {"_checks": 0, "_files": 0, "_settings": -1, "_memory": 0, "_pytree": 0, "_progress": 0,
          "_moved": 0, "numerics": 0, "models": 1, "decoders": 2, "sampling": 3, "theory": 3,
          "tuning": 4, "auditing": 4, "pairs": 4, "experiments": 5, "compat": 5, "cli": 6,
          "__init__": 7, "__main__": 7}


def _part(module: str) -> str:
    """``specjax.sampling.engine`` -> ``sampling``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specjax"):
            if node.module == "specjax":
                yield from (f"specjax.{alias.name}" for alias in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("specjax."))


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_imports_run_one_way(path):
    relative = path.relative_to(PACKAGE).with_suffix("")
    part = relative.parts[0]
    layer = LAYERS[part]
    for module in _imports(path):
        other = _part(module)
        assert other in LAYERS, module
        if other == part:
            continue
        assert LAYERS[other] < layer, f"{relative} (layer {layer}) imports {module}"


def test_every_decoder_is_one_file_of_the_protocol():
    import specjax
    decoders = PACKAGE / "decoders"
    for name in ("Autoregressive", "Speculative", "BatchSpeculative", "BiasedSpeculative",
                 "RejectionRule", "BlockVerification"):
        cls = getattr(specjax, name)
        assert issubclass(cls, (specjax.TokenwiseDecoder, specjax.CallDecoder)), name
        assert pathlib.Path(__import__(cls.__module__, fromlist=["_"]).__file__).parent \
            == decoders, name


# --- the contributing guide's layout table ---------------------------------------------------------

GUIDE = PACKAGE.parent / "docs" / "guides" / "contributing.md"


def layout_table(text: str) -> dict[str, list[str]]:
    """The package rows of the guide's "Layout of the package" table: ``{row: [paths]}``, each
    path relative to the repository root. A row's first cell names a folder (``specjax/sampling/``)
    or files (``specjax/_checks.py``, ``_pytree.py``); every ```` `name.py` ```` of the row is a
    file, relative to that folder (to the first file's folder for a row of files) unless it
    starts with ``specjax/``."""
    section = text.split("## Layout of the package", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`specjax/"):
            continue
        first = cells[0].split("`")[1]
        base = first if first.endswith("/") else first.rsplit("/", 1)[0] + "/"
        paths = [first]
        for name in re.findall(r"`([\w/]+\.py)`", line):
            paths.append(name if name.startswith("specjax/") else base + name)
        rows[first] = sorted(set(paths))
    return rows


def test_layout_table_parser():
    text = ("## Layout of the package\n\n| path | what |\n| --- | --- |\n"
            "| `specjax/a/` | `x.py` (the x), `y.py`; see `specjax/b.py` |\n"
            "| `specjax/_c.py`, `_d.py` | helpers |\n| `scripts/` | `s.py` |\n\n## Next\n"
            "| `specjax/z/` | `ignored.py` |\n")
    assert layout_table(text) == {
        "specjax/a/": ["specjax/a/", "specjax/a/x.py", "specjax/a/y.py", "specjax/b.py"],
        "specjax/_c.py": ["specjax/_c.py", "specjax/_d.py"]}


def test_contributing_layout_table_matches_the_tree():
    """Every module of the package is in docs/guides/contributing.md's layout table (a
    subpackage's ``__init__.py`` is its folder's row), and every path the table names exists.
    When a module is added, moved or split, this test names the row to update."""
    root = PACKAGE.parent
    rows = layout_table(GUIDE.read_text())
    named = {path for paths in rows.values() for path in paths}
    missing = [path for path in sorted(named) if not (root / path).exists()]
    assert not missing, f"{GUIDE.name}'s layout table names paths that do not exist: {missing}"
    modules = [str(p.relative_to(root)) for p in MODULES
               if not (p.name == "__init__.py" and p.parent != PACKAGE)]
    absent = [m for m in modules if m not in named]
    assert not absent, (f"modules missing from {GUIDE.name}'s layout table (add each to the row of "
                        f"its folder): {absent}")


def test_every_module_is_at_most_500_lines():
    """Issue 48: a module a reader can hold; split by cohesive parts, names served from the old
    path."""
    long = {str(p.relative_to(PACKAGE)): n for p in MODULES
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
