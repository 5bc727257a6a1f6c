"""Coverage by construction: what must hold for every decoder and every public name is found by
walking the package, not read from a hand list.

* Every concrete decoder class (a public subclass of ``TokenwiseDecoder`` or ``CallDecoder``
  defined in specjax) is exported, documented in the API reference and a case of
  ``sampler_cases.CASES``, and the tests that run the cases through ``decode``, ``exact``,
  ``decoding_statistics`` and sharded ``decode`` consume every case.
* Every name of the public contract (``../shared/API.md``) resolves at the top level without a
  warning, and the top level stays small: ``__all__`` is exactly its public attributes.
* Every parametrised test keeps a case in the inner loop (``-m "not slow"``): the cases that run
  in the full suite only are written ``full_suite_only`` beside one that is not.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import warnings

import pytest

import specjax
import specjax.decoders
from sampler_cases import CASES
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import TokenwiseDecoder

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent

#: The most names the top level may export (issue 31).
MAX_TOP_LEVEL = 80


def concrete_decoders() -> list[type]:
    """Every public, non-abstract subclass of the two protocols defined in specjax (every module
    of ``specjax.decoders`` imported first, so a decoder no ``__init__`` imports is found too)."""
    for module in pkgutil.walk_packages(specjax.decoders.__path__, "specjax.decoders."):
        importlib.import_module(module.name)
    found, todo = set(), [TokenwiseDecoder, CallDecoder]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("specjax.") and not sub.__name__.startswith("_") \
                    and not inspect.isabstract(sub):
                found.add(sub)
    return sorted(found, key=lambda c: c.__name__)


def documented_objects() -> list[object]:
    """The objects of every mkdocstrings entry (``::: path``) of ``docs/api/*.md``."""
    objects = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for path in re.findall(r"^::: *([\w.]+)", page.read_text(), flags=re.MULTILINE):
            objects.append(resolve(path))
    return objects


def resolve(path: str):
    """The object a dotted path names (the longest importable module, then attributes), with
    warnings as errors: the reference must not document a deprecated spelling."""
    parts = path.split(".")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for name in parts[cut:]:
                obj = getattr(obj, name)
            return obj
    raise AssertionError(f"{path} names nothing")


def test_the_walk_finds_the_decoders():
    """The walk itself: it finds both kinds and nothing that is not a decoder."""
    decoders = concrete_decoders()
    assert specjax.Speculative in decoders and specjax.BlockVerification in decoders
    assert TokenwiseDecoder not in decoders and CallDecoder not in decoders
    assert all(issubclass(c, (TokenwiseDecoder, CallDecoder)) for c in decoders)


@pytest.mark.parametrize("decoder", concrete_decoders(), ids=lambda c: c.__name__)
def test_every_decoder_is_exported_documented_and_a_sampler_case(decoder):
    name = decoder.__name__
    exported = (name in specjax.__all__ and vars(specjax).get(name) is decoder) or (
        name in specjax.decoders.__all__ and vars(specjax.decoders).get(name) is decoder)
    assert exported, f"{name}: export it from specjax or specjax.decoders (and __all__)"
    assert any(obj is decoder for obj in documented_objects()), (
        f"{name}: add a '::: specjax.{name}' entry to docs/api/decoders.md")
    assert any(type(case) is decoder for case in CASES.values()), (
        f"{name}: add a case with representative settings to tests/sampler_cases.py")


def _parametrized_names(test) -> list:
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"
             and m.args[0] == "name"]
    assert len(marks) == 1, test.__name__
    return list(marks[0].args[1])


def test_the_case_driven_tests_consume_every_case():
    """``decode`` and ``decoding_statistics`` (``test_scale``), ``exact`` and every other entry
    point on every model kind (``test_decoders``' support table, whose ``_supported`` declares
    what a decoder cannot run) and sharded ``decode`` (``sharded_check.py``) iterate all of
    ``CASES``, not a subset."""
    import test_decoders
    import test_scale
    assert _parametrized_names(
        test_scale.test_statistics_equal_trace_counts_in_padded_chunks) == list(CASES)
    assert _parametrized_names(
        test_decoders.test_every_decoder_entry_point_and_model_kind_works_or_is_refused) \
        == list(CASES)
    # The sharded check is a script (4 forced devices): it loops over CASES itself.
    tree = ast.parse((HERE / "sharded_check.py").read_text())
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "sampler_cases"
                for alias in node.names if alias.name == "CASES"}
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)
             and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Attribute)
             and isinstance(node.iter.func.value, ast.Name)
             and node.iter.func.value.id in imported and node.iter.func.attr == "items"]
    assert imported == {"CASES"} and loops, "sharded_check.py must loop over all of CASES"


def _is_call(node, name: str) -> bool:
    """Whether ``node`` calls ``name`` (``name(...)`` or ``something.name(...)``)."""
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id == name)
        or (isinstance(node.func, ast.Attribute) and node.func.attr == name))


def test_the_inner_loop_runs_every_test_function():
    """A parametrised test keeps at least one case in the inner loop (``-m "not slow"``): every
    ``full_suite_only`` case sits in the literal list of a ``parametrize`` that has a case
    without it, and no case is marked slow in another way (``pytest.param(..., marks=slow)``
    would escape this check)."""
    problems = []
    for path in sorted(HERE.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        checked = set()
        for node in ast.walk(tree):
            if not (_is_call(node, "parametrize") and len(node.args) >= 2
                    and isinstance(node.args[1], (ast.List, ast.Tuple))):
                continue
            cases = node.args[1].elts
            heavy = [case for case in cases if _is_call(case, "full_suite_only")]
            checked.update(map(id, heavy))
            if heavy and len(heavy) == len(cases):
                problems.append(f"{path.name}:{node.lineno}: every case is full_suite_only")
        for node in ast.walk(tree):
            if _is_call(node, "full_suite_only") and id(node) not in checked:
                problems.append(f"{path.name}:{node.lineno}: full_suite_only outside the "
                                "literal case list of a parametrize")
            if _is_call(node, "param") and any(
                    "slow" in ast.unparse(keyword.value) for keyword in node.keywords
                    if keyword.arg == "marks"):
                problems.append(f"{path.name}:{node.lineno}: a case marked slow without "
                                "full_suite_only")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------- the public contract
def api_md() -> pathlib.Path | None:
    """``../shared/API.md`` beside the repository (``SPECJAX_API_MD`` overrides it)."""
    path = pathlib.Path(os.environ.get("SPECJAX_API_MD", ROOT.parent / "shared" / "API.md"))
    return path if path.is_file() else None


SUBPACKAGES = ("models", "decoders", "sampling", "theory", "tuning", "auditing", "pairs", "compat")


def specjax_name(name: str) -> bool:
    """Whether some part of specjax defines ``name`` (the top level, an old top-level name, or
    a subpackage)."""
    if name in specjax.__all__ or name in specjax._MOVED:
        return True
    return any(name in vars(importlib.import_module(f"specjax.{package}"))
               for package in SUBPACKAGES)


def api_names(text: str) -> tuple[set[str], set[str]]:
    """``(names, new)``: the names of API.md, and those of its sections headed "(new)", which a
    later issue adds. A name is a backticked span of a table's first column, or a backticked
    call or name elsewhere in a table row that specjax defines somewhere (``-> `ExactDecoding```,
    ``residual_distribution(q, p)``; not ``min(1, q / p)``), every ``specjax.name``, and the
    helpers named in "Writing a decoder"."""
    names, new, old, section = set(), set(), set(), ""
    for line in text.splitlines():
        if line.startswith("#"):
            section = line
            continue
        spans = []
        if line.startswith("|") and not set(line) <= set("|- "):
            cells = line.split("|")
            spans += re.findall(r"`([^`]+)`", cells[1])
            for rest in cells[2:]:
                spans += [m.group(1) for s in re.findall(r"`([^`]+)`", rest)
                          if (m := re.fullmatch(r"([A-Za-z_]\w*)(\(.*\))?", s))
                          and specjax_name(m.group(1))]
        if section.startswith("## Writing a decoder"):
            spans += [s for s in re.findall(r"`([^`]+)`", line)
                      if re.match(r"@?[A-Za-z]+(_\w+|[A-Z]\w*)", s)]
        found = {m.group(1) for s in spans if (m := re.match(r"@?([A-Za-z_]\w*)", s))}
        found |= set(re.findall(r"specjax\.([A-Za-z_]\w*)", line))
        names |= found
        if "(new)" in section:
            new |= found
        else:
            old |= found
    return names, new - old


def test_every_api_md_name_resolves_at_the_top_level_without_a_warning():
    path = api_md()
    if path is None:
        pytest.skip("../shared/API.md is not beside this checkout (set SPECJAX_API_MD)")
    names, new = api_names(path.read_text())
    assert {"decode", "exact", "DecodingTrace", "TokenTree", "verify_tree_law",
            "decoder_dataclass"} <= names  # the parser reads what it should
    missing = []
    for name in sorted(names):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            present = hasattr(specjax, name)
        if not present and name not in new:
            missing.append(name)
        if present:
            assert name in specjax.__all__, f"{name} is in API.md: it stays first-class"
    assert not missing, missing


def test_top_level_is_small_and_all_is_its_public_attributes():
    assert len(specjax.__all__) <= MAX_TOP_LEVEL, len(specjax.__all__)
    assert len(set(specjax.__all__)) == len(specjax.__all__)
    public = {name for name, value in vars(specjax).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert public == set(specjax.__all__), public ^ set(specjax.__all__)
    listed = {name for name in dir(specjax) if not name.startswith("_")
              and not inspect.ismodule(getattr(specjax, name))}
    assert listed == set(specjax.__all__)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_subpackage_all_is_its_public_attributes(package):
    module = importlib.import_module(f"specjax.{package}")
    public = {name for name, value in vars(module).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert public == set(module.__all__), public ^ set(module.__all__)


#: Modules without an ``__all__`` for now: being split (issue 48); each gets one when it is done.
MODULES_WITHOUT_ALL = frozenset()


def _bound_names(body) -> set[str]:
    """The names a module's top-level statements bind: definitions, assignments and imports
    (also those under a top-level ``if``, ``try`` or ``with``)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        elif isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            names |= _bound_names(node.body)
            names |= _bound_names(getattr(node, "orelse", []))
            names |= _bound_names(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                names |= _bound_names(handler.body)
    return names


def test_every_module_declares_all():
    """Every module of specjax (read with ``ast``, not imported) assigns a literal ``__all__`` of
    distinct names at module level, each defined or imported there, so that ``from m import *``
    works; the modules being split are the listed exceptions."""
    problems = []
    for path in sorted((ROOT / "specjax").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=name)
        values = [node.value for node in tree.body
                  if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
                  and any(isinstance(t, ast.Name) and t.id == "__all__"
                          for t in (node.targets if isinstance(node, ast.Assign)
                                    else [node.target]))]
        if not values:
            if name not in MODULES_WITHOUT_ALL:
                problems.append(f"{name}: no module-level __all__")
            continue
        try:
            exported = ast.literal_eval(values[-1])
        except ValueError:
            problems.append(f"{name}: __all__ is not a literal list of names")
            continue
        if len(set(exported)) != len(exported):
            problems.append(f"{name}: __all__ repeats a name")
        undefined = sorted(set(exported) - _bound_names(tree.body))
        if undefined:
            problems.append(f"{name}: __all__ names what the module does not bind: {undefined}")
    assert not problems, "\n".join(problems)
