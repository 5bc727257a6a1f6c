"""Traversal Verification against token-level verification of the same tree, exactly.

For each instance and tree shape the table gives, in float64 and exactly (no simulation):

* ``TV``: ``TraversalVerification(tree, children=...)`` (leaf to root, Weng et al. 2025) and
  ``token``: ``TokenTree(tree, children=...)``, the same tree drafted the same way verified token
  by token, for ``iid`` drafts (SpecInfer's multi-step rejection sampling) and ``wor``, drafts
  without replacement (the paper's drafting; Sequoia's recursive rejection sampling);
* the tokens per call at position 1, ``1 + E[drafts kept]`` of the first call, the previous
  token from the target's law of ``x_0`` (from the decoders' exact call laws), and over a whole
  decode of ``T`` tokens, ``T / E[calls]`` (``specjax.exact``);
* ``ctx TV < token``: of the contexts ``a`` of position 1, how many give Traversal Verification
  a smaller expected accepted length than token-level verification.

Then chains against ``BlockVerification`` (equal), and every case where Traversal Verification
accepts less (at position 1 on average, in any context of position 1, or over the whole decode).
``refused``: the exact law of Traversal Verification without replacement is too large there (the
n-grams' lifted chain has 16 states).

Instances: the paper's (``specjax.paper_instance()``: V = 7, T = 50); n-grams of text (the
characters of the standard library in 4 classes, a bigram draft and a trigram target lifted to a
stationary Markov chain over the trigram's contexts, as ``scripts/token_tree_study.py`` builds
them: S = 16 states, T = 20); random pairs (``specjax.random_markov_chain``, V = 5, T = 20, two
concentrations: peaked 0.3 and flat 3.0; ``--seeds`` picks the keys).

Usage: python scripts/study_traversal.py [--trees "2;3;2,1;2,2;3,1;1,1,1;2,1,1"]
       [--seeds 0] [--skip-ngram] [--max-bytes 2000000]
       tiny: --trees "2;2,1" --seeds 0 --skip-ngram
The default run takes a few minutes on 2 CPU cores (compiling the exact values of each tree).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jax
import numpy as np

import specjax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import token_tree_study  # noqa: E402  (the n-gram instance and the law of contexts)


def instances(args):
    out = []
    draft, target = specjax.paper_instance()
    out.append(("paper", to64(draft), to64(target)))
    if not args.skip_ngram:
        draft, target, _, _ = token_tree_study.ngram_instance(args.max_bytes, 20)
        out.append(("n-grams", to64(draft), to64(target)))
    for seed in args.seeds:
        for concentration in (0.3, 3.0):
            key_d, key_t = jax.random.split(jax.random.key(seed))
            draft = specjax.random_markov_chain(key_d, 5, 20, concentration=concentration)
            target = specjax.random_markov_chain(key_t, 5, 20, concentration=concentration)
            out.append((f"random s={seed} c={concentration}", to64(draft), to64(target)))
    return out


def to64(chain):
    """The chain in float64 NumPy (made into JAX arrays under x64 by ``main``): the instances
    are drawn in float32, JAX's default, so they are the ones a reader gets (under x64 the same
    keys draw other rows), each row renormalised in float64 (a change of about 1e-7)."""
    init, trans = np.asarray(chain.init, np.float64), np.asarray(chain.trans, np.float64)
    return init / init.sum(), trans / trans.sum(-1, keepdims=True)


def first_call_length(decoder, draft, target):
    """``(V,)`` expected drafts kept by the call at position 1, per previous token, from the
    decoder's exact call law."""
    k = min(decoder.lookahead, target.horizon)
    law = decoder.call_law(draft.trans[:k], target.trans[:k],
                           target.trans[min(k, target.horizon - 1)],
                           with_bonus=k < target.horizon)
    return np.asarray(jax.numpy.sum(law.kept, axis=(0, 2)))


def values(decoder, draft, target):
    """``(tokens per call at position 1, accepted length per context, T / E[calls])``, or
    ``None`` where the exact law is refused (too large)."""
    try:
        decoder.check_exact(target.num_states, target.horizon)
    except ValueError:
        return None
    length = first_call_length(decoder, draft, target)
    context = token_tree_study.context_law(target)
    calls = float(specjax.exact(decoder, draft, target).expected_calls)
    return 1.0 + float(context @ length), length, target.horizon / calls


def fmt(value, i):
    return "refused" if value is None else f"{value[i]:.4f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="2;3;2,1;2,2;3,1;1,1,1;2,1,1")
    parser.add_argument("--seeds", default="0", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--skip-ngram", action="store_true")
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    trees = [tuple(int(b) for b in t.split(",")) for t in args.trees.split(";")]
    start = time.time()
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average, {os.cpu_count()} cores)\n")
    print("Tokens per call at position 1 (1 + E[drafts kept]) and over the whole decode "
          "(T / E[calls]):\n")
    print("| instance | tree | drafts | TV | token | TV - token | T/E[calls] TV | token "
          "| ctx TV < token |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worse, chains = [], []
    drawn = instances(args)
    with jax.enable_x64(True):  # exact values in float64 (the previous setting is restored)
        table(drawn, trees, worse, chains)
    print("\nChains against block verification (T / E[calls]):")
    for line in chains or ["none run"]:
        print(f"- {line}")
    print("\nCases where Traversal Verification accepts less than token-level verification of the "
          "same drafts:")
    for line in worse or ["none"]:
        print(f"- {line}")
    print(f"\n({time.time() - start:.0f} s)")


def table(drawn, trees, worse, chains):
    for name, (d_init, d_trans), (t_init, t_trans) in drawn:
        draft = specjax.MarkovChain(jax.numpy.asarray(d_init), jax.numpy.asarray(d_trans))
        target = specjax.MarkovChain(jax.numpy.asarray(t_init), jax.numpy.asarray(t_trans))
        context = token_tree_study.context_law(target)
        for tree in trees:
            for children in ("iid", "without_replacement"):
                tv = values(specjax.TraversalVerification(tree, children=children), draft, target)
                token = values(specjax.TokenTree(tree, children=children), draft, target)
                below = ((tv[1] < token[1] - 1e-12) & (context > 0)) if tv else None
                gap = f"{tv[0] - token[0]:+.4f}" if tv else "-"
                count = (f"{int(below.sum())}/{int((context > 0).sum())}" if tv else "-")
                short = "iid" if children == "iid" else "wor"
                print(f"| {name} | {tree} | {short} | {fmt(tv, 0)} | {fmt(token, 0)} | {gap} "
                      f"| {fmt(tv, 2)} | {fmt(token, 2)} | {count} |", flush=True)
                if tv is None:
                    continue
                if tv[0] < token[0] - 1e-12:
                    worse.append(f"{name} {tree} {short}: tokens/call at position 1 "
                                 f"{tv[0]:.4f} < {token[0]:.4f}")
                if tv[2] < token[2] - 1e-12:
                    worse.append(f"{name} {tree} {short}: T/E[calls] {tv[2]:.4f} < {token[2]:.4f}")
                if below.any():
                    gaps = (token[1] - tv[1])[below]
                    worse.append(f"{name} {tree} {short}: {int(below.sum())} contexts of "
                                 f"position 1 accept less (largest gap {gaps.max():.4f})")
            if set(tree) == {1} and tv is not None:
                block = values(specjax.BlockVerification(len(tree)), draft, target)
                chains.append(f"{name} {tree}: TV {tv[2]:.10f}, BlockVerification({len(tree)}) "
                              f"{block[2]:.10f} tokens per call (difference "
                              f"{abs(tv[2] - block[2]):.1e})")


if __name__ == "__main__":
    main()
