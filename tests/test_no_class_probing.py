"""No module outside ``specjax/decoders/`` asks a decoder what class it is (issue 48, item 2).

A consumer reads the protocol members a decoder declares (``specjax.decoders.base.PROTOCOL``):
``isinstance`` against the protocol bases (``Decoder``, ``TokenwiseDecoder``, ``CallDecoder``)
is the protocol itself, but ``isinstance`` against a concrete decoder (``BlockVerification``,
``TokenTree``, ...), a comparison with one (``type(decoder) is Speculative``), a list of them or
a class name as a string (``type(decoder).__name__ == "BiasedSpeculative"``) is not: a user's
decoder that declares the same capability would be treated differently. The members that
replaced such probes are checked here on a user's decoder that declares them.
"""

from __future__ import annotations

import ast
import math
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.auditing.given_tree import tree_of
from specjax.decoders import base

PACKAGE = pathlib.Path(specjax.__file__).parent
DECODERS = PACKAGE / "decoders"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if DECODERS not in p.parents)


def _concrete_decoders() -> frozenset[str]:
    """The names of the concrete decoder classes specjax exports (subclasses of ``Decoder``
    other than the protocol bases)."""
    names = set()
    for module in (specjax, specjax.decoders):
        for name in dir(module):
            value = getattr(module, name, None)
            if isinstance(value, type) and issubclass(value, base.Decoder) \
                    and value not in base.PROTOCOL:
                names.add(value.__name__)
    return frozenset(names)


CONCRETE = _concrete_decoders()


def _named(node) -> str | None:
    """``C`` for ``C`` and ``module.C``; ``None`` otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _class_probes(source: str, concrete=CONCRETE) -> list[str]:
    """The class probes of concrete decoders in a module's source, as ``line: text``:
    ``isinstance``/``issubclass`` against one (alone or in a tuple), an identity or equality
    test with one, a tuple, list or set literal of them, and a string equal to one's name
    (outside ``__all__``)."""
    tree = ast.parse(source)
    exported = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                exported.update(id(n) for n in ast.walk(node.value))
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Call) and _named(node.func) in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            hit = any(_named(n) in concrete for n in ast.walk(node.args[1]))
        elif isinstance(node, ast.Compare):
            hit = any(_named(n) in concrete for n in [node.left, *node.comparators])
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hit = any(_named(n) in concrete for n in node.elts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            hit = node.value in concrete and id(node) not in exported
        if hit:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_rule_finds_class_probes():
    source = '''
__all__ = ["Speculative", "run"]

def run(decoder):
    if isinstance(decoder, BlockVerification):
        pass
    if isinstance(decoder, (TokenwiseDecoder, specjax.TokenTree)):
        pass
    if type(decoder) is Speculative:
        pass
    if type(decoder).__name__ in ("BiasedSpeculative", "Lenient"):
        pass
    LOSSY = [TypicalAcceptance, TopKAcceptance]
    ok = isinstance(decoder, (TokenwiseDecoder, CallDecoder)) and decoder.lossless
    made = Speculative(lookahead=2)  # building one is not asking what one is
'''
    lines = [line.split(":")[0] for line in _class_probes(source)]
    assert sorted(set(lines), key=int) == ["5", "7", "9", "11", "13"], lines


def test_the_concrete_decoders_are_the_exported_ones():
    assert {"Speculative", "BlockVerification", "TokenTree", "BatchSpeculative",
            "BiasedSpeculative", "AdaptiveSpeculative"} <= CONCRETE
    assert not {"Decoder", "TokenwiseDecoder", "CallDecoder"} & CONCRETE


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_module_outside_decoders_asks_a_decoder_its_class(path):
    probes = _class_probes(path.read_text())
    assert not probes, (f"{path.relative_to(PACKAGE)} asks a decoder its class; declare a "
                        f"capability in specjax/decoders/base.py, set it in the decoder and read "
                        f"it: {probes}")


# --- the members that replaced the probes, read from a user's decoder that declares them ------


def test_the_new_members_are_declared_with_their_defaults():
    assert {"verifies_jointly", "over_acceptance", "given_tree"} <= set(base.PROTOCOL[base.Decoder])
    assert "stationary_form" in base.PROTOCOL[base.CallDecoder]
    sd, block = specjax.Speculative(), specjax.BlockVerification(2)
    assert (sd.verifies_jointly, sd.over_acceptance, sd.given_tree()) == (False, 0.0, None)
    assert block.verifies_jointly and block.given_tree() is None
    assert block.stationary_form() is block


@specjax.decoder_dataclass
class _OverAccepting(specjax.Speculative):
    """SD that declares an over-acceptance (its laws are SD's: only the member is read here)."""

    @property
    def over_acceptance(self):
        return 0.125


def test_the_objective_reads_over_acceptance():
    assert specjax.tuning.biased_tradeoff(0.25).epsilon == 0.25
    assert specjax.BiasedSpeculative(0.5).over_acceptance == 0.5
    assert specjax.tuning.objective(_OverAccepting(), "rejections").epsilon == 0.125
    assert specjax.tuning.make_objective("sd").epsilon == 0.0
    assert specjax.tuning.kl_divergence().epsilon == 0.0


@specjax.decoder_dataclass
class _ChainSpeculative(specjax.Speculative):
    """SD with lookahead ``K`` declared as the chain tree ``(1, ..., 1)`` it verifies."""

    def given_tree(self):
        return specjax.TokenTree((1,) * self.lookahead)


def test_given_trees_read_given_tree():
    assert tree_of(specjax.TokenTree((2, 1))) == specjax.TokenTree((2, 1))
    assert tree_of(specjax.BatchSpeculative(3, lookahead=2, replacement=False)) == \
        specjax.TokenTree((3, 1), children="without_replacement")
    assert tree_of(_ChainSpeculative(lookahead=2)) == specjax.TokenTree((1, 1))
    for decoder in (specjax.BatchSpeculative(math.inf, lookahead=2), specjax.BatchSpeculative(2),
                    specjax.Speculative(lookahead=2), specjax.BlockVerification(2)):
        with pytest.raises(ValueError, match="has no given-tree form"):
            tree_of(decoder)
    p = jnp.array([[0.5, 0.5, 0.0]] * 3)
    q = jnp.array([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.1, 0.6, 0.3]])
    tokens = jnp.array([0, 1, 0])
    ours = specjax.verify_tree_law(_ChainSpeculative(lookahead=2), tokens, p, q)
    chain = specjax.verify_tree_law(specjax.TokenTree((1, 1)), tokens, p, q)
    np.testing.assert_allclose(ours.outcome, chain.outcome)


def test_stationary_form_takes_a_threshold_table_at_its_first_row():
    rows = np.zeros((4, 3, 2), np.float32)
    table = specjax.decoders.ThresholdTable(rows)
    decoder = specjax.AdaptiveSpeculative(table, max_lookahead=2)
    first = decoder.stationary_form()
    assert np.shape(first.policy.thresholds) == (1, 3, 2) and first.max_lookahead == 2
    assert first.stationary_form().policy.thresholds.shape == (1, 3, 2)
    moving = specjax.AdaptiveSpeculative(
        specjax.decoders.ThresholdTable(rows + np.arange(4, dtype=np.float32)[:, None, None]),
        max_lookahead=2)
    with pytest.raises(ValueError, match="ThresholdTable's rows differ from position"):
        moving.stationary_form()
    fixed = specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(2), max_lookahead=2)
    assert fixed.stationary_form() is fixed
