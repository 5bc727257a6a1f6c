"""Battery cases of issue 52 ("No silent number, no lost file"), in the style of
``tests/reliability_cases.py`` (whose ``_cases`` calls ``add_cases(add, S)``):

* a ``min_variance`` that pools every category away (``compare_outputs``,
  ``auditing.check_provenance``, ``auditing.history.sequence_fit``): refused when it is not a
  positive finite number, and a result that says it could not test (``tested`` False) when it
  leaves nothing to test;
* ``pairs.distill.decoding_objective`` with ``logits=False``: draft rows that are not laws, or
  of too few tokens, refused (NaN under ``jax.jit``, documented);
* ``random_markov_chain`` with a concentration the dtype cannot hold: refused (a traced one
  under ``jax.jit`` gives NaN rows, never a hang);
* ``models.penalize`` of a ``MarkovChain`` under ``jax.jit`` with a traced penalty.

Each case ends in "clear error" or "right"; the valid inputs of these entry points are cases too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def add_cases(add, S) -> None:
    """Adds the cases through ``add(kind, entry, what, run, error=, check=, isolate=)``."""
    from reliability_cases import built_once
    from reliability_cases import is_law
    from reliability_cases import key

    from specjax.auditing import check_provenance
    from specjax.auditing.history import sequence_fit
    from specjax.auditing.history import sequence_law
    from specjax.models import Penalties
    from specjax.models import penalize
    from specjax.pairs.distill import decoding_objective

    # ------------------------------------------------------------------ min_variance
    kind = "numeric settings"
    x = np.array([1])
    p = np.array([[0.5, 0.5, 0.0]], np.float32)
    q = np.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], np.float32)
    constant = np.tile(np.array([1, 2]), (2000, 1))  # an engine that always emits [1, 2]

    def correct_runs():
        return np.asarray(S.verify_drafts(
            key(), S.Speculative(), jnp.tile(jnp.asarray(x), (2000, 1)),
            jnp.tile(jnp.asarray(p), (2000, 1, 1)), jnp.tile(jnp.asarray(q), (2000, 1, 1))).tokens)

    def compare(tokens, **kwargs):
        return S.compare_outputs(S.Speculative(), x, p, q, tokens, **kwargs)

    for what, value in (("inf", math.inf), ("NaN", math.nan), ("-1", -1.0), ("'5'", "5")):
        add(kind, "compare_outputs", f"min_variance {what}",
            lambda v=value: compare(constant, min_variance=v), "min_variance")
    add(kind, "compare_outputs", "min_variance 1e12 (pools every category: not tested)",
        lambda: compare(constant, min_variance=1e12),
        check=lambda r: not r.tested and not r.flagged and "NOT TESTED" in r.summary())
    add(kind, "compare_outputs", "3 runs (too few to test: not tested)",
        lambda: compare(constant[:3]), check=lambda r: not r.tested and not r.flagged)
    add(kind, "compare_outputs", "an engine that always emits [1, 2] (flagged)",
        lambda: compare(constant), check=lambda r: r.flagged and r.tested and r.impossible == 0)
    add(kind, "compare_outputs", "2,000 runs of a correct sampler (valid)",
        lambda: compare(correct_runs()),
        check=lambda r: r.tested and not r.flagged and r.impossible == 0)

    uniform = np.full((400, 1, 4), 0.25, np.float32)

    def fair_drafts():
        return np.asarray(jax.random.randint(key(), (400, 1), 0, 4))

    for what, value in (("inf", math.inf), ("NaN", math.nan), ("0", 0.0)):
        add(kind, "check_provenance", f"min_variance {what}",
            lambda v=value: check_provenance(fair_drafts(), uniform, min_variance=v),
            "min_variance")
    add(kind, "check_provenance", "min_variance 1e12 (pools every category: not tested)",
        lambda: check_provenance(fair_drafts(), uniform, min_variance=1e12),
        check=lambda r: not r.tested and not r.flagged and "NOT TESTED" in r.summary())
    add(kind, "check_provenance", "every draft 0 of a uniform declared row (flagged)",
        lambda: check_provenance(np.zeros((400, 1), np.int32), uniform),
        check=lambda r: r.flagged and r.tested)
    add(kind, "check_provenance", "drafts drawn from the declared rows (valid)",
        lambda: check_provenance(fair_drafts(), uniform),
        check=lambda r: r.tested and not r.flagged and r.impossible == 0)

    def fit_law():
        base = S.FiniteStateModel(0, jnp.zeros((1, 2), int), jnp.array([[0.25, 0.75]]))
        return sequence_law(base, 1)

    def fit_samples():
        law = fit_law()
        index = np.random.default_rng(52).choice(len(law.probs), size=2000, p=law.probs)
        return law.sequences[index]

    for what, value in (("inf", math.inf), ("NaN", math.nan), ("-1", -1.0)):
        add(kind, "sequence_fit", f"min_variance {what}",
            lambda v=value: sequence_fit(fit_samples(), fit_law(), min_variance=v),
            "min_variance")
    add(kind, "sequence_fit", "min_variance 1e12 (pools every sequence: not tested)",
        lambda: sequence_fit(fit_samples(), fit_law(), min_variance=1e12),
        check=lambda r: not r.tested and not r.flagged)
    add(kind, "sequence_fit", "always (0, 0) (flagged)",
        lambda: sequence_fit(np.zeros((2000, 2), np.int32), fit_law()),
        check=lambda r: r.flagged and r.tested)
    add(kind, "sequence_fit", "samples of the law (valid)",
        lambda: sequence_fit(fit_samples(), fit_law()),
        check=lambda r: r.tested and not r.flagged and r.impossible == 0)

    # ------------------------------------------------------------------ decoding_objective
    kind = "probabilities"

    @built_once  # concrete, also when first built inside a jax.jit trace
    def recording():
        return S.Recording.from_statistics(
            jnp.array([[0, 1, 1], [0, 0, 1]]), jnp.full((2, 2), 0.5),
            jnp.array([[0.5, 0.8], [0.5, 0.2]]))

    def apply(params, tokens):
        return jnp.broadcast_to(params, (2, 2, params.shape[-1]))

    def objective(params, **kwargs):
        return decoding_objective(S.Speculative(), apply, **kwargs)(params, recording()).value

    law = np.array([0.3, 0.7], np.float32)
    right_value = 0.5 * (0.1 / 0.8 + 0.2 / 0.5)  # rates [q - p]_+ / q along the two sequences
    for what, params in (("rows summing to 2", 2 * law), ("a negative entry", [-0.2, 1.2]),
                         ("a NaN entry", [0.3, math.nan]), ("V = 1 < a recorded token", [1.0])):
        add(kind, "pairs.distill.decoding_objective", f"logits=False, {what}",
            lambda v=params: objective(jnp.asarray(v, jnp.float32)), "apply")
    add(kind, "pairs.distill.decoding_objective", "logits='no'",
        lambda: objective(jnp.asarray(law), logits="no"), "logits")
    add(kind, "pairs.distill.decoding_objective", "logits=False, rows that are laws (valid)",
        lambda: objective(jnp.asarray(law)),
        check=lambda r: abs(float(r) - right_value) < 1e-5)
    add(kind, "pairs.distill.decoding_objective", "jax.jit, rows that are laws (valid)",
        lambda: jax.jit(objective)(jnp.asarray(law)),
        check=lambda r: abs(float(r) - right_value) < 1e-5)
    add(kind, "pairs.distill.decoding_objective",
        "jax.jit, rows summing to 2 (documented NaN, not a number)",
        lambda: bool(jnp.isnan(jax.jit(objective)(2 * jnp.asarray(law)))),
        check=lambda r: r is True)
    add(kind, "pairs.distill.decoding_objective", "jax.grad, rows summing to 2",
        lambda: jax.grad(objective)(2 * jnp.asarray(law)), "apply")

    # ------------------------------------------------------------------ concentration
    kind = "numeric settings"
    info = jnp.finfo(jnp.result_type(float))
    smallest = float(-np.log(float(info.tiny)) / float(info.max)) * 1.01
    too_big = 1e39 if info.bits == 32 else math.inf  # infinite in the working dtype
    too_small = 1e-50 if info.bits == 32 else 1e-320
    for method in ("fast", "jax"):
        entry = f"random_markov_chain(method={method!r})"
        add(kind, entry, f"concentration {too_big:g} (infinite in the working dtype)",
            lambda m=method: S.random_markov_chain(key(), 4, 3, too_big, method=m),
            "concentration", isolate=True)
        add(kind, entry, f"concentration {too_small:g} (below what the dtype draws)",
            lambda m=method: S.random_markov_chain(key(), 4, 3, too_small, method=m),
            "concentration", isolate=True)
        for what, value in (("-1", -1.0), ("NaN", math.nan), ("inf", math.inf)):
            add(kind, entry, f"jax.jit, traced concentration {what} (documented NaN)",
                lambda m=method, v=value: bool(jnp.all(jnp.isnan(jax.jit(
                    lambda c: S.random_markov_chain(key(), 4, 3, c, method=m).trans)(v)))),
                check=lambda r: r is True, isolate=True)
        add(kind, entry, "concentration at the bottom of the range (valid, one-hot rows)",
            lambda m=method: S.random_markov_chain(key(), 4, 3, smallest, method=m),
            check=lambda c: is_law(c.trans) and bool(np.all(np.asarray(c.trans).max(-1)
                                                             > 0.999)))
        add(kind, entry, "concentration 3e38 (valid, near-uniform rows)",
            lambda m=method: S.random_markov_chain(key(), 4, 3, 3e38, method=m),
            check=lambda c: is_law(c.trans) and np.allclose(np.asarray(c.trans), 0.25,
                                                            atol=1e-3))
        add(kind, entry, "jax.jit, traced concentration 0.5 (valid: the concrete draw)",
            lambda m=method: (jax.jit(lambda c: S.random_markov_chain(
                key(), 4, 3, c, method=m).trans)(0.5),
                S.random_markov_chain(key(), 4, 3, 0.5, method=m).trans),
            check=lambda r: is_law(r[0]) and np.allclose(r[0], r[1], rtol=1e-4, atol=1e-6))

    # ------------------------------------------------------------------ traced penalties
    kind = "transformations"

    def chain():
        return S.random_markov_chain(jax.random.key(3), 3, 2)

    for name in ("repetition", "frequency", "presence"):
        add(kind, "models.penalize", f"jax.jit, traced {name} 2.0 of a MarkovChain",
            lambda n=name: (jax.jit(lambda r: penalize(chain(), Penalties(**{n: r})).table)(2.0),
                            penalize(chain(), Penalties(**{n: 2.0})).table),
            check=lambda r: is_law(r[0]) and np.allclose(r[0], r[1], rtol=1e-5, atol=1e-7))
    add(kind, "models.penalize", "jax.grad in a traced repetition",
        lambda: jax.grad(lambda r: penalize(chain(), Penalties(repetition=r)).table[5, 0])(2.0),
        check=lambda g: bool(np.isfinite(float(g))) and float(g) != 0.0)
    add(kind, "models.penalize", "jax.jit, traced cap",
        lambda: jax.jit(lambda c: penalize(chain(), Penalties(cap=c)).table)(2), "cap")
    add(kind, "models.penalize", "repetition 2.0 (valid)",
        lambda: penalize(chain(), Penalties(repetition=2.0)),
        check=lambda m: is_law(m.table) and m.table.shape == (7 * 4 * 2**3, 3))
