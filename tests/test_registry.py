"""Decoders register themselves (issue 48): a decoder class gives its own example cases
(``example_cases``), from which ``sampler_cases.CASES`` (the conformance suite's cases) and the
capability table of docs/guides/decoders.md are built, and nothing lists the decoders by hand.

* ``CASES`` is the registry's, and the committed guide holds the table the registry renders.
* A decoder written in a new module (a temporary file here) is one class with its case method:
  with no other edit it is among the registry's cases, passes the conformance checks
  (``decoder_checks.assert_conforms``) and has its row in the rendered table of the guide.
* The multi-draft decoders of i.i.d. drafts share one head (``IidMultiDraft``).
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import jax
import numpy as np
import pytest

import specjax
from decoder_checks import assert_conforms
from sampler_cases import CASES
from specjax.decoders import registry
from specjax.decoders import verification
from specjax.decoders.gumbel_list import gumbel_list_root_law
from specjax.decoders.iid_multi_draft import IidMultiDraft
from specjax.decoders.importance_weighted import importance_weighted_root_law
from specjax.decoders.k_sequential import k_sequential_root_law

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guides" / "decoders.md"
REFRESH = "python -m specjax.decoders.registry docs/guides/decoders.md"

#: A new decoder, as its author writes it in a file of its own: the class and its cases, nothing
#: else. A lossless rule that accepts half of SD's mass (its rejected mass is the rest of ``q``).
NEW_DECODER = '''
import jax.numpy as jnp

import specjax


@specjax.decoder_dataclass
class HalfSpeculative(specjax.TokenwiseDecoder):
    """Accepts half of SD's accepted mass; the rejected mass is the rest of the target's row."""

    lookahead: int | None = None

    def laws(self, p, q):
        accepted = 0.5 * jnp.minimum(p, q)
        law = specjax.decoders.VerificationLaw(accepted, q - accepted)
        return law, law

    @classmethod
    def example_cases(cls):
        return {"half sd K=2": cls(lookahead=2)}
'''


def new_module(tmp_path, monkeypatch, source: str):
    """The module of ``source``, written to a temporary file and imported under a name of its
    own (removed from ``sys.modules`` after the test)."""
    name = f"new_decoder_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses reads the module's namespace
    spec.loader.exec_module(module)
    return module


def generated(text: str) -> str:
    """The generated table of a page (between the registry's markers)."""
    return text.split(registry.TABLE_BEGIN)[1].split(registry.TABLE_END)[0].strip()


def test_the_cases_are_the_registrys():
    assert CASES == registry.decoder_cases() and len(CASES) >= 28
    classes = registry.registered_decoders()
    assert [type(case) for case in CASES.values()] == sorted(
        (type(case) for case in CASES.values()), key=classes.index)
    assert specjax.Speculative in classes and specjax.TokenTree in classes
    assert IidMultiDraft not in classes and specjax.decoders.Decoder not in classes
    # the default: not registered; a registered class's cases are its own
    assert specjax.decoders.Decoder.example_cases() == {}
    assert all(type(case) is cls for cls in classes for case in cls.example_cases().values())


def test_the_guide_holds_the_registrys_table():
    assert generated(GUIDE.read_text()) == registry.capability_table(), (
        f"docs/guides/decoders.md's capability table is stale: run `{REFRESH}`")


def test_refresh_page_rewrites_only_the_table(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n{registry.TABLE_BEGIN}\nold\n{registry.TABLE_END}\n\nafter\n")
    assert registry.refresh_page(page) and not registry.refresh_page(page)
    text = page.read_text()
    assert text.startswith("# Title\n\n") and text.endswith("\n\nafter\n")
    assert generated(text) == registry.capability_table()
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="TABLE_BEGIN and TABLE_END"):
        registry.refresh_page(page)
    assert registry.main([]) == 2


def test_a_decoder_in_a_new_module_runs_through_the_suite_and_the_docs(tmp_path, monkeypatch):
    module = new_module(tmp_path, monkeypatch, NEW_DECODER)
    packages = ("specjax", module.__name__)
    cases = registry.decoder_cases(packages)
    # (a) registered by its own case method, after specjax's own (which stay as they are)
    assert {name: case for name, case in cases.items() if name != "half sd K=2"} == CASES
    assert type(cases["half sd K=2"]) is module.HalfSpeculative
    assert "half sd K=2" not in registry.decoder_cases()  # specjax's registry is unchanged
    # (b) the conformance checks every case passes
    assert_conforms(cases["half sd K=2"])
    # (c) its row in the guide's table, refreshed by the registry alone
    row = ('| `half sd K=2` | `HalfSpeculative` | token-wise | yes | M F P | yes | `"rows"` |')
    assert row in registry.capability_table(packages).splitlines()
    page = tmp_path / "decoders.md"
    page.write_text(GUIDE.read_text())
    assert registry.refresh_page(page, packages)
    before, after = GUIDE.read_text().splitlines(), page.read_text().splitlines()
    assert [line for line in after if line not in before] == [row]
    assert [line for line in before if line not in after] == []


CASE_ERRORS = '''
import specjax


@specjax.decoder_dataclass
class Borrowed(specjax.Speculative):
    @classmethod
    def example_cases(cls):
        return {"borrowed": specjax.Speculative()}


@specjax.decoder_dataclass
class Inherits(specjax.Speculative):
    """Inherits Speculative's cases: not registered a second time."""
'''


def test_the_registry_refuses_cases_it_cannot_table(tmp_path, monkeypatch):
    module = new_module(tmp_path, monkeypatch, CASE_ERRORS)
    packages = ("specjax", module.__name__)
    assert module.Inherits not in registry.registered_decoders(packages)
    with pytest.raises(ValueError, match="'borrowed' is a Speculative, not a Borrowed"):
        registry.decoder_cases(packages)
    monkeypatch.setattr(module.Borrowed, "example_cases", classmethod(
        lambda cls: {"sd": cls()}))
    with pytest.raises(ValueError, match="the case name 'sd' is taken by a"):
        registry.decoder_cases(packages)


# ---------------------------------------------------------------- the multi-draft decoders' head
@jax.jit
def _laws(p, q):
    ours = [cls(2).laws(p, q) for cls in (specjax.KSequential, specjax.ImportanceWeighted,
                                           specjax.GumbelList)]
    roots = [law(p, q, 2) for law in (k_sequential_root_law, importance_weighted_root_law,
                                      gumbel_list_root_law)]
    return ours, roots, verification.speculative_law(p, q)


def test_the_iid_multi_draft_decoders_share_one_head():
    with pytest.raises(TypeError, match="abstract"):
        IidMultiDraft(2)
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.0, 0.9]], np.float32)
    q = np.array([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], np.float32)
    ours, roots, sd = _laws(p, q)
    for (root, verify), want in zip(ours, roots):
        for got, expected in zip([*root, *verify], [*want, *sd]):
            np.testing.assert_array_equal(got, expected)
    labels = {"k-sequential, M = 2, K = 3", "importance-weighted, M = 2, K = 3",
              "Gumbel list coupling, M = 2, K = 3"}
    for cls in (specjax.KSequential, specjax.ImportanceWeighted, specjax.GumbelList):
        assert issubclass(cls, IidMultiDraft) and not cls.same_root and not cls.probes_laws
        assert cls(2, lookahead=3).label in labels and cls(3).lookahead is None
        with pytest.raises(ValueError, match="math.inf"):
            cls(math.inf)
        with pytest.raises(ValueError, match="lookahead"):
            cls(2, lookahead=0)
        with pytest.raises(TypeError):
            cls(2, 3)  # lookahead is keyword-only

    @specjax.decoder_dataclass
    class OwnRoot(specjax.KSequential):
        def root_law(self, p, q):
            return verification.speculative_law(p, q)

    assert OwnRoot.probes_laws  # a new root law is probed as new laws are
