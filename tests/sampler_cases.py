"""Every decoder with representative settings, shared by the scale tests and their subprocess.

``CASES`` maps a name to a decoder value; every entry point takes it as it is.
"""

import jax.numpy as jnp

import specjax


def sd_accept(p, q):
    return jnp.where(p > 0, jnp.minimum(1.0, q / jnp.where(p > 0, p, 1.0)), 1.0)


def sd_residual(p, q, b):
    return jnp.maximum(q - p, 0.0)


CASES = {
    "autoregressive": specjax.Autoregressive(),
    "sd": specjax.Speculative(),
    "sd K=3": specjax.Speculative(lookahead=3),
    "batch M=3": specjax.BatchSpeculative(3),
    "batch M=2 K=2": specjax.BatchSpeculative(2, lookahead=2),
    "batch M=2 w/o replacement": specjax.BatchSpeculative(2, replacement=False),
    "optimal M=3 K=2": specjax.OptimalMultiDraft(3, lookahead=2),
    "k-sequential M=2": specjax.KSequential(2),
    "importance-weighted M=2 K=3": specjax.ImportanceWeighted(2, lookahead=3),
    "spechub": specjax.SpecHub(),
    "gumbel list M=2": specjax.GumbelList(2),
    "biased eps=0.1 UNO K=4": specjax.BiasedSpeculative(0.1, residual="target", lookahead=4),
    "rejection": specjax.RejectionRule(sd_accept, sd_residual),
    "block K=3": specjax.BlockVerification(3),
    "tree (2, 2)": specjax.TokenTree((2, 2)),
    "tree w/o replacement": specjax.TokenTree.from_parents((-1, 0, 0, 1, 2, 3),
                                                           children="without_replacement"),
    "tree top-k (3, 1)": specjax.TokenTree((3, 1), children="top_k"),
    "traversal (2,)": specjax.TraversalVerification((2,)),
    "dynamic tree P=6 D=3": specjax.DynamicTree(6, max_depth=3),
    "speed of light P=5 D=2": specjax.DynamicTree(5, max_depth=2, rank="target"),
    "adaptive SpecDec++ 0.3 K<=3": specjax.AdaptiveSpeculative(
        specjax.decoders.RejectionThreshold(0.3), max_lookahead=3),
    "HF schedule from 1, K<=3": specjax.HeuristicSchedule(1, max_lookahead=3),
    "lenient l=0.6": specjax.LenientSpeculative(0.6),
    "threshold 0.5/0.7 K=3": specjax.ThresholdVerification(0.5, 0.7, lookahead=3),
    "top-2 acceptance, optimal residual": specjax.TopKAcceptance(2, residual="optimal"),
    "typical 0.2/0.3 K=4": specjax.TypicalAcceptance(0.2, 0.3, lookahead=4),
    "strict K=2": specjax.decoders.StrictVerification(lookahead=2),
    "parallel draft K=2": specjax.decoders.ParallelDraft(2),
}


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
