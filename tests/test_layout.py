"""The package layout reads as the field, and its imports run one way: models <- decoders <-
sampling and theory <- tuning and auditing <- experiments and the CLI (a decoder only describes
its laws; sampling and theory never import each other)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "specjax"
LAYERS = {"_checks": 0, "_memory": 0, "_pytree": 0, "_progress": 0, "_moved": 0, "models": 1,
          "decoders": 2, "sampling": 3, "theory": 3, "tuning": 4, "auditing": 4, "compat": 5,
          "experiments": 5, "cli": 6, "__init__": 7, "__main__": 7}


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
