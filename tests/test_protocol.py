"""The decoder protocol is explicit, and the package's internals are shared by public name.

* No module reads a decoder's attribute by probing (``hasattr``/``getattr``) or compares a
  decoder's methods by identity: every hook is declared on ``specjax.decoders.base`` with its
  default (``PROTOCOL``), and the entry points read it.
* No module imports, or reads, a private name (``_name``) of a module in another subpackage:
  what the subpackages share is public (``specjax.numerics``, ``specjax.decoders.planning``).
* A user's decoder that overrides ``bind`` is still verified by the given-drafts kernel.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoders import base

PACKAGE = pathlib.Path(specjax.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
PROTOCOL_BASES = {cls.__name__ for cls in base.PROTOCOL}


def _identifier(node) -> str | None:
    """``decoder`` for ``decoder``, ``self.decoder``, ``run.decoder``; ``None`` otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _decoder_probes(source: str) -> list[str]:
    """The probes of decoders in a module's source, as ``line: text``.

    A probe is ``hasattr(x, ...)`` or ``getattr(x, ...)`` where ``x`` names a decoder (an
    identifier containing ``decoder``: ``decoder``, ``self.decoder``, ``run.decoder``), or is
    ``self``/``cls`` in a method of a protocol base class (the bases must not probe the
    subclasses); and an identity test (``is``/``is not``) on an attribute of a protocol base
    class or of ``type(<decoder>)``, e.g. ``type(decoder).bind is not TokenwiseDecoder.bind``.
    A decoder's own file may read its own fields (``getattr(self.accept_prob, "__name__")``).
    """
    tree = ast.parse(source)
    found = []

    def names_decoder(node, in_base: bool) -> bool:
        name = _identifier(node)
        if name is None:
            return False
        return "decoder" in name.lower() or (in_base and isinstance(node, ast.Name)
                                             and name in ("self", "cls"))

    def is_method_of_protocol(node) -> bool:
        if not isinstance(node, ast.Attribute):
            return False
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in PROTOCOL_BASES:
            return True
        return (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                and owner.func.id == "type" and len(owner.args) == 1
                and names_decoder(owner.args[0], False))

    def visit(node, in_base: bool):
        if isinstance(node, ast.ClassDef):
            in_base = node.name in PROTOCOL_BASES
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("hasattr", "getattr") and node.args \
                and names_decoder(node.args[0], in_base):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot))
                                                 for op in node.ops) \
                and any(is_method_of_protocol(x) for x in [node.left, *node.comparators]):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_base)

    visit(tree, False)
    return found


def test_the_probe_rule_finds_probes():
    source = '''
def run(decoder, run):
    if hasattr(decoder, "validate"):
        decoder.validate()
    n = getattr(run.decoder, "num_drafts", 1)
    same = type(decoder).bind is not TokenwiseDecoder.bind
    name = getattr(model, "name", None)  # not a decoder

class TokenwiseDecoder:
    def resolve_lookahead(self, horizon):
        return getattr(self, "lookahead", None)

class MyRule(TokenwiseDecoder):
    def label(self):
        return getattr(self, "name", "rule")  # a decoder's own fields, in its own file
'''
    assert [line.split(":")[0] for line in _decoder_probes(source)] == ["3", "5", "6", "11"]


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_module_probes_a_decoder(path):
    probes = _decoder_probes(path.read_text())
    assert not probes, (f"{path.relative_to(PACKAGE)} probes a decoder; declare the hook in "
                        f"specjax/decoders/base.py and read it: {probes}")


def _module_of(dotted: str) -> pathlib.Path | None:
    """The file of a ``specjax`` module or package, or ``None`` for a name that is neither."""
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def _part(path: pathlib.Path) -> str:
    """The subpackage of a module (``decoders`` for ``specjax/decoders/base.py``); a module
    at the package's root is its own part (``numerics``, ``_checks``)."""
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_crossings(path: pathlib.Path, source: str) -> list[str]:
    """Private names of a module in another subpackage that ``source`` imports or reads.

    ``from specjax.X.Y import _name`` is flagged when ``specjax.X.Y`` is in another part than
    ``path``, and so is ``y._name`` where ``y`` is such a module bound by an import (``from
    specjax.decoders import verification as _verify``, then ``_verify._tiny``). Importing a
    module is not importing a name: the private modules at the package's root (``_checks``,
    ``_memory``, ``_pytree``, ``_progress``) are the package's internals, shared by design.
    """
    here = _part(path)
    tree = ast.parse(source)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "specjax":
            source_file = _module_of(node.module)
            for alias in node.names:
                as_module = _module_of(f"{node.module}.{alias.name}")
                if as_module is not None:
                    modules[alias.asname or alias.name] = as_module
                elif _private(alias.name) and source_file is not None \
                        and _part(source_file) != here:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("specjax.") and alias.asname:
                    modules[alias.asname] = _module_of(alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and _private(node.attr) and node.value.id in modules \
                and modules[node.value.id] is not None \
                and _part(modules[node.value.id]) != here:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_import_rule_finds_crossings():
    source = '''
from specjax.decoders.verification import _safe_ratio
from specjax.theory.cost import _check_cost
from specjax.decoders import verification as _verify
from specjax import _checks
x = _verify._tiny(1.0) + _checks.check_key
'''
    path = PACKAGE / "theory" / "example.py"
    assert [line.split(":")[0] for line in _private_crossings(path, source)] == ["2", "6"]


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_private_name_crosses_subpackages(path):
    crossings = _private_crossings(path, path.read_text())
    assert not crossings, (f"{path.relative_to(PACKAGE)} reads private names of another "
                           f"subpackage; make them public there: {crossings}")


# --- every hook declared, with its default ---------------------------------------------------

#: Members a decoder must give itself (the protocol declares them without a default).
REQUIRED = {base.Decoder: (),
            base.TokenwiseDecoder: ("laws",),
            base.CallDecoder: ("lookahead", "num_uniforms", "sample_call", "call_law")}

#: The hooks the entry points once probed for: each is a declared member now.
ONCE_PROBED = {"validate", "uses_draft", "reads_draft_probs", "residual_given_draft",
               "acceptance", "drafted_call_law_from", "lookahead", "num_drafts", "check_exact",
               "uses_position"}


@specjax.decoder_dataclass
class _MinimalTokenwise(specjax.TokenwiseDecoder):
    def laws(self, p, q):
        return specjax.Speculative().laws(p, q)


@specjax.decoder_dataclass
class _MinimalCall(specjax.CallDecoder):
    lookahead: int = 1


def test_every_hook_is_declared_on_the_base_classes_with_its_default():
    declared = set().union(*base.PROTOCOL.values())
    assert ONCE_PROBED <= declared, sorted(ONCE_PROBED - declared)
    instances = {base.Decoder: _MinimalTokenwise(), base.TokenwiseDecoder: _MinimalTokenwise(),
                 base.CallDecoder: _MinimalCall()}
    for cls, members in base.PROTOCOL.items():
        for name in members:
            where = [k for k in cls.__mro__ if name in vars(k)
                     or name in vars(k).get("__annotations__", {})]
            assert where and where[0] in base.PROTOCOL, (cls.__name__, name)
            if name in REQUIRED[cls]:
                continue
            value = getattr(instances[cls], name)  # the default: no AttributeError
            if name.startswith(("has_", "uses_", "reads_", "same_", "binds_")):
                assert isinstance(value, bool), (cls.__name__, name)
    probe = _MinimalTokenwise()
    assert (probe.lookahead, probe.num_drafts, probe.validate(), probe.uses_draft) \
        == (None, 1, None, True)
    assert not (probe.has_acceptance or probe.has_residual_given_draft or probe.binds_models)
    assert probe.reads_draft_probs and probe.resolve_lookahead(7) == 7
    call = _MinimalCall()
    assert not (call.has_drafted_call_law or call.uses_position)
    assert call.check_exact(3, 4) is None and call.resolve_lookahead(7) == 1
    with pytest.raises(NotImplementedError, match="acceptance"):
        probe.acceptance(None, None)
    with pytest.raises(NotImplementedError, match="drafted_call_law_from"):
        call.drafted_call_law_from(None, None, None, None, with_bonus=True)


def test_a_field_of_a_protocol_member_keeps_its_own_default_or_none():
    with pytest.raises(TypeError, match="num_drafts"):
        specjax.BatchSpeculative()  # a required field, though the protocol's default is 1
    assert specjax.BatchSpeculative(3).num_drafts == 3
    assert specjax.Speculative(lookahead=2).lookahead == 2


def test_a_decoder_that_defines_a_hook_has_its_capability():
    @specjax.decoder_dataclass
    class Capped(_MinimalTokenwise):
        lookahead: int | None = None

        def acceptance(self, p, q):
            return 0.5 * jnp.minimum(1, q / p)

    assert Capped.has_acceptance and not _MinimalTokenwise.has_acceptance
    assert specjax.objective(Capped(), "tradeoff").quantity == "tradeoff"
    with pytest.raises(ValueError, match="acceptance probabilities"):
        specjax.objective(_MinimalTokenwise(), "tradeoff")
    assert specjax.AdaptiveSpeculative.has_drafted_call_law
    assert specjax.ThresholdVerification.has_residual_given_draft
    assert not specjax.TypicalAcceptance.reads_draft_probs
    assert not specjax.Autoregressive.uses_draft


def test_decoders_have_no_kind():
    for cls in (specjax.Speculative, specjax.BlockVerification, base.Decoder):
        assert not hasattr(cls, "kind")


# --- the given-drafts path accepts a user's subclass that overrides bind ---------------------


@specjax.decoder_dataclass
class _BindingSpeculative(specjax.Speculative):
    """A user's SD that overrides ``bind`` (it returns itself: the law is still of its rows)."""

    def bind(self, p, q):
        del p, q
        return self


@specjax.decoder_dataclass
class _ModelBound(specjax.Speculative):
    binds_models = True


def test_given_drafts_accept_a_subclass_that_overrides_bind():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=(2, 3)).astype(np.float32)
    q = rng.dirichlet(np.ones(5), size=(2, 4)).astype(np.float32)
    tokens = np.array([[0, 1, 2], [3, 4, 0]], np.int32)
    u, v = rng.random((2, 3)), rng.random((2, 4))
    ours = specjax.verify_drafts(None, _BindingSpeculative(), tokens, p, q, uniforms=(u, v))
    sd = specjax.verify_drafts(None, specjax.Speculative(), tokens, p, q, uniforms=(u, v))
    np.testing.assert_array_equal(ours.tokens, sd.tokens)
    law = specjax.verify_drafts_law(_BindingSpeculative(), tokens, p, q)
    np.testing.assert_allclose(law.outcome, specjax.verify_drafts_law(
        specjax.Speculative(), tokens, p, q).outcome)
    with pytest.raises(ValueError, match="depends on the whole models"):
        specjax.verify_drafts(None, _ModelBound(), tokens, p, q, uniforms=(u, v))
    with pytest.raises(ValueError, match="depends on the whole models"):
        specjax.verify_drafts(None, specjax.BatchSpeculative(2), tokens, p, q, uniforms=(u, v))


def test_one_plan_for_every_entry_point():
    """The sampler and the exact values refuse the same way, by one message."""
    from specjax.decoders.planning import plan_run  # noqa: PLC0415

    draft, target = specjax.paper_instance()
    run = plan_run(specjax.Speculative(lookahead=4), draft, target, engine="exact")
    assert (run.kind, run.horizon, run.lookahead) == ("markov", target.horizon, 4)
    run = plan_run(specjax.BlockVerification(99), draft, target, engine="monte_carlo",
                   num_chains=8)
    assert run.decoder.lookahead == run.lookahead == target.horizon  # truncated for the sampler
    assert plan_run(specjax.Autoregressive(), None, target, engine="exact").draft is target
    with pytest.raises(ValueError, match="engine must be one of"):
        plan_run(specjax.Speculative(), draft, target, engine="exactly")
    with pytest.raises(ValueError, match="epsilon"):
        plan_run(specjax.BiasedSpeculative(-1.0), draft, target, engine="exact")
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="epsilon"):
        specjax.decode(key, specjax.BiasedSpeculative(-1.0), draft, target, 4)
