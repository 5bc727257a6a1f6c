"""Every decoder with representative settings, shared by the scale tests and their subprocess.

``CASES`` maps a name to a decoder value; every entry point takes it as it is. It is built by
construction (``specjax.decoders.registry.decoder_cases``): each decoder class gives its own
cases (``example_cases``), so a new decoder joins every test that iterates ``CASES`` with no edit
here.
"""

import specjax
from specjax.decoders.registry import decoder_cases
from specjax.decoders.rejection import sd_accept  # noqa: F401 - the "rejection" case's rule
from specjax.decoders.rejection import sd_residual  # noqa: F401

CASES = decoder_cases()


def instance(num_states=5, horizon=12, seed=3):
    """A small float32 pair with zeros, so edge cases occur in every run."""
    import jax
    key_d, key_t = jax.random.split(jax.random.key(seed))
    draft = specjax.random_markov_chain(key_d, num_states, horizon, concentration=0.5)
    target = specjax.random_markov_chain(key_t, num_states, horizon, concentration=0.5)
    return draft, target


#: The cases whose sampled tokens are the same in every compiled program (trace, chunked
#: statistics, sharded): a declared property of each case, which the scale tests and the sharded
#: check read. GumbelList's float32 root law is a sum with cancellation whose last bits XLA may
#: round differently from one program to another, so a uniform within an ulp of a threshold can
#: be sampled differently: in one fresh-clone CI run its chunked statistics differed from the
#: trace (it passed in others). Such a case still runs through every program; there its chains
#: must agree but for a few (``MAX_DIFFERING``), and its laws are checked by exact values and
#: Monte Carlo.
REPRODUCIBLE = {name: decoder for name, decoder in CASES.items()
                if not isinstance(decoder, specjax.GumbelList)}

#: The largest fraction of chains whose counts may differ between two compiled programs for a
#: case outside ``REPRODUCIBLE`` (a uniform within an ulp of a threshold: far rarer than this).
MAX_DIFFERING = 0.01


def differing_chains(a, b) -> float:
    """The fraction of chains whose ``(num_rejections, num_calls)`` differ between two runs."""
    import numpy as np
    differ = (np.asarray(a.num_rejections) != np.asarray(b.num_rejections)) \
        | (np.asarray(a.num_calls) != np.asarray(b.num_calls))
    return float(differ.mean())



#: Decoders whose calls can end with a bonus token before ``K`` drafts (a leaf of a tree above
#: its deepest level): which positions verified a draft cannot be re-derived from a trace's call
#: structure alone for them.
EARLY_BONUS = {name for name, decoder in CASES.items()
               if isinstance(decoder, (specjax.DynamicTree, specjax.AdaptiveSpeculative,
                                       specjax.HeuristicSchedule))
               or (isinstance(decoder, specjax.TokenTree) and decoder.branching is None)}
