"""The model protocol (``specjax.models.base``, issue 48): declared on base classes, read and never
probed; a user's object of the protocol needs no base class and still runs; one adapter
(``as_model``) reads it, and names what it lacks."""

import ast
import dataclasses
import importlib
import pathlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.decoders
import specjax.models
from specjax.models.base import MODEL_PROTOCOL
from specjax.models.base import Model
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.base import UserModel
from specjax.models.base import as_model
from specjax.models.base import model_view

PACKAGE = pathlib.Path(specjax.__file__).parent
KEY = jax.random.key(0)
T = 6


def _ngram(seed: int, order: int = 2, v: int = 4):
    rows = np.random.default_rng(seed).dirichlet(np.ones(v), size=v ** (order - 1))
    return specjax.models.NGramModel(jnp.asarray(rows, jnp.result_type(float)), order)


# ------------------------------------------------------------------------- no probing left

#: Every declared member of the protocol, and the fields that were probed before (a chain's
#: ``trans``, its ``_validated`` flag); not ``dtype`` and ``update``, which other values have too
#: (a key's ``dtype``, an optimizer's ``update``: read where they are not models).
MEMBERS = {name for names in MODEL_PROTOCOL.values() for name in names} - {"dtype", "update"} | {
    "trans", "table", "_validated"}
PROBES = ("getattr", "hasattr", "getattr_static")


def _calls(path: pathlib.Path):
    """``(line, function name, the attribute name when a literal)`` of every ``getattr``,
    ``hasattr`` and ``inspect.getattr_static`` call of a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        if name not in PROBES:
            continue
        attribute = node.args[1].value if len(node.args) > 1 and isinstance(
            node.args[1], ast.Constant) else None
        yield node.lineno, name, attribute


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_probe_finder_finds_probes(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import inspect\nhasattr(m, 'probs')\nx = getattr(a, b, None)\n"
                    "inspect.getattr_static(m, 'logits')\ngetattr_x(m, 'probs')\n")
    assert list(_calls(path)) == [(2, "hasattr", "probs"), (3, "getattr", None),
                                  (4, "getattr_static", "logits")]


def test_no_model_is_probed_in_the_library():
    """No ``getattr``/``hasattr`` at all in ``specjax/models/`` and ``sampling/decoding.py``; none
    of a protocol member anywhere in the package; and a static lookup only in the one adapter
    (``models/base.py``, ``_given_members``)."""
    found = []
    for path in MODULES:
        relative = path.relative_to(PACKAGE).as_posix()
        for line, name, attribute in _calls(path):
            where = f"{relative}:{line} {name}({attribute!r})"
            if name == "getattr_static":
                if relative != "models/base.py":
                    found.append(where)
            elif relative.startswith("models/") or relative == "sampling/decoding.py" \
                    or attribute in MEMBERS:
                found.append(where)
    assert not found, f"models probed outside specjax.models.base.as_model: {found}"
    adapter = [line for line, name, _ in _calls(PACKAGE / "models" / "base.py")]
    assert len(adapter) == 1, adapter


# ------------------------------------------------------------------------- the declared protocol


def _library_models() -> list[type]:
    """Every class of specjax that is a ``Model`` (every module of ``specjax.models`` imported)."""
    for module in pkgutil.walk_packages(specjax.models.__path__, "specjax.models."):
        importlib.import_module(module.name)
    found, todo = set(), [Model]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("specjax."):
                found.add(sub)
    return sorted(found, key=lambda c: c.__name__)


def test_the_walk_finds_the_models():
    names = {cls.__name__ for cls in _library_models()}
    assert {"MarkovChain", "FiniteStateModel", "NGramModel", "GreedyModel", "ProcessedModel",
            "PromptedModel", "StaticLeaves", "UserModel", "ProtocolModel"} <= names, names


@pytest.mark.parametrize("cls", _library_models(), ids=lambda c: c.__name__)
def test_every_library_model_declares_its_kind(cls):
    assert "kind" in vars(cls), f"{cls.__name__} does not declare its kind"
    assert isinstance(cls.kind, ModelKind)


def test_the_kinds():
    draft, _ = specjax.paper_instance()
    ngram = _ngram(0)
    assert draft.kind == ModelKind.MARKOV == "markov"
    assert ngram.as_finite_state().kind == ModelKind.FINITE_STATE == "finite_state"
    assert ngram.kind == specjax.models.GreedyModel(ngram).kind == ModelKind.PROTOCOL == "protocol"
    assert isinstance(ngram.as_finite_state(), ProtocolModel)
    assert not isinstance(draft, ProtocolModel)
    # The decoders spell the kinds they support as the models declare them.
    for module in pkgutil.walk_packages(specjax.decoders.__path__, "specjax.decoders."):
        importlib.import_module(module.name)
    classes, todo = set(), [specjax.decoders.base.Decoder]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            classes.add(sub)
    spelled = {kind for cls in classes if isinstance(vars(cls).get("model_kinds"), tuple)
               for kind in cls.model_kinds}
    assert spelled <= set(ModelKind), spelled
    pair = specjax.models.checks.model_kind(ngram, ngram)
    assert pair is ModelKind.PROTOCOL and f"{pair}" == "protocol"


def test_every_member_is_declared_with_a_default_and_a_docstring():
    for cls, members in MODEL_PROTOCOL.items():
        for name in members:
            assert name in vars(cls) or name in cls.__annotations__, (cls.__name__, name)
            value = vars(cls).get(name)
            if callable(value) or isinstance(value, property):
                assert (value.__doc__ or "").strip(), (cls.__name__, name)


def test_a_subclass_that_defines_a_hook_gives_it():
    class Logits(ProtocolModel):
        num_states = 3

        def init_state(self):
            return jnp.zeros((), jnp.int32)

        def logits(self, state):
            return jnp.array([0.0, 1.0, 2.0])

        def update(self, state, token):
            return state

    model = Logits()
    assert (model.has_logits, model.has_probs, model.has_probs_block) == (True, False, False)
    np.testing.assert_allclose(model.probs(model.init_state()), jax.nn.softmax(jnp.arange(3.0)),
                               rtol=1e-6)
    assert model.probs_block(model.init_state(), jnp.array([1, 2])).shape == (3, 3)
    assert model.dtype == jnp.result_type(float)
    assert as_model(model) is model
    ngram = _ngram(1)
    assert (ngram.has_probs, ngram.has_logits, ngram.dtype) == (True, False, ngram.table.dtype)


# ------------------------------------------------------------------------- a user's object


@jax.tree_util.register_pytree_node_class
class Duck:
    """A user's model of the protocol: no base class, delegating to an n-gram."""

    def __init__(self, inner):
        self.inner = inner

    def tree_flatten(self):
        return (self.inner,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    num_states = property(lambda self: self.inner.num_states)

    def init_state(self):
        return self.inner.init_state()

    def probs(self, state):
        return self.inner.probs(state)

    def update(self, state, token):
        return self.inner.update(state, token)


@jax.tree_util.register_pytree_node_class
class NoUpdate(Duck):
    """A user's model that forgot ``update``."""

    update = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ArrayNamedLogits:
    """The guide's ``Fatigue``: a leaf named ``logits`` (an array, not a hook) and ``probs``."""

    logits: jax.Array

    @property
    def num_states(self):
        return self.logits.shape[-1]

    def init_state(self):
        return jnp.zeros((), jnp.int32)

    def probs(self, state):
        return jax.nn.softmax(self.logits)

    def update(self, state, token):
        return state


def test_the_adapter_declares_what_a_users_object_gives():
    duck = Duck(_ngram(2))
    view = as_model(duck)
    assert isinstance(view, UserModel) and view.model is duck and view.kind == "protocol"
    assert (view.has_probs, view.has_logits, view.has_probs_block) == (True, False, False)
    leaves, treedef = jax.tree_util.tree_flatten(view)
    assert len(leaves) == 1 and jax.tree_util.tree_unflatten(treedef, leaves).model.inner.order == 2
    fatigue = as_model(ArrayNamedLogits(jnp.zeros(3)))
    assert fatigue.has_probs and not fatigue.has_logits  # an array field is not a hook
    assert model_view(Duck) is None and model_view("duck") is None
    assert specjax.models.is_autoregressive_model(duck)
    assert not specjax.models.is_autoregressive_model(specjax.paper_instance()[0])


def test_a_users_object_runs_through_decode_unchanged():
    draft, target = _ngram(3), _ngram(4)
    decoder = specjax.Speculative(2)
    want = specjax.decode(KEY, decoder, draft, target, 500, horizon=T)
    got = specjax.decode(KEY, decoder, Duck(draft), Duck(target), 500, horizon=T)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    batched = specjax.decode(KEY, decoder, Duck(draft), Duck(target), 500, horizon=T,
                             batched_scoring=True)
    plain = specjax.decode(KEY, decoder, draft, target, 500, horizon=T, batched_scoring=True)
    np.testing.assert_array_equal(batched.tokens, plain.tokens)
    counts = specjax.decoding_statistics(KEY, decoder, Duck(draft), Duck(target), 500,
                                         horizon=T)
    np.testing.assert_array_equal(counts.num_rejections, want.num_rejections)
    # exact values need a finite state space: the user's object is refused with the reason
    with pytest.raises(ValueError, match="both be MarkovChains, or both FiniteStateModels"):
        specjax.exact(decoder, Duck(draft), Duck(target), horizon=T)
    lifted = [m.as_finite_state(1) for m in (draft, target)]
    assert float(specjax.exact(decoder, *lifted, horizon=T).expected_calls) > 0


def test_a_users_object_missing_a_hook_gets_one_error_naming_it():
    ngram = _ngram(5)
    with pytest.raises(ValueError, match=r"target must be a specjax.MarkovChain or an "
                                         r"autoregressive model .* got NoUpdate; it lacks "
                                         r"update$"):
        specjax.decode(KEY, specjax.Speculative(2), ngram, NoUpdate(ngram), 10, horizon=T)
    with pytest.raises(ValueError, match="draft must be .* got str; it lacks num_states, "
                                         "init_state, probs or logits, update"):
        specjax.decode(KEY, specjax.Speculative(2), "ngram", ngram, 10, horizon=T)
    with pytest.raises(ValueError, match="model must be .* got the class Duck"):
        specjax.models.process_model(Duck)

    class Empty(ProtocolModel):
        num_states = 3

    with pytest.raises(ValueError, match="got Empty; it lacks init_state, probs or logits, "
                                         "update"):
        as_model(Empty())
