"""Traversal Verification against token-level verification of the same tree, exactly.

For each instance and tree shape the table gives, in float64 and exactly (no simulation):

* ``tokens/call``: ``1 + E[drafts kept]`` of a call at position 1, the previous token from the
  target's law of ``x_0`` (``specjax.accepted_length``), for ``TraversalVerification(tree)``
  (``TV``: leaf to root, Weng et al. 2025), ``TokenTree(tree)`` (``iid``: the same tree drafted
  the same way, verified token by token with SpecInfer's multi-step rejection sampling) and
  ``TokenTree(tree, children="without_replacement")`` (``wor``: Sequoia's drafts and recursive
  rejection sampling; another draft law);
* ``T/E[calls]``: tokens per target call over a whole decode of ``T`` tokens (``specjax.exact``);
* ``ctx TV < iid``: of the contexts ``a`` of position 1, how many give Traversal Verification a
  smaller expected accepted length than token-level verification of the same i.i.d. tree.

Then every case where Traversal Verification accepts less than ``iid`` or ``wor`` (at position 1
on average, in any context of position 1, or over the whole decode) is listed.

Instances: the paper's (``specjax.paper_instance()``: V = 7, T = 50); n-grams of text (the
characters of the standard library in 4 classes, a bigram draft and a trigram target lifted to a
stationary Markov chain over the trigram's contexts, as ``scripts/token_tree_study.py`` builds
them: S = 16 states, T = 20); random pairs (``specjax.random_markov_chain``, V = 5, T = 20, two
concentrations: peaked 0.3 and flat 3.0).

Usage: python scripts/study_traversal.py [--trees "2;3;2,1;2,2;3,1;1,1,1;2,1,1"]
       [--seeds 0,1] [--skip-ngram] [--max-bytes 2000000]
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

jax.config.update("jax_enable_x64", True)

import specjax  # noqa: E402

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
    return specjax.MarkovChain(jax.numpy.asarray(chain.init, "float64"),
                               jax.numpy.asarray(chain.trans, "float64"))


def values(decoder, draft, target):
    """``(tokens per call at position 1, accepted length per context, T / E[calls])``."""
    length = np.asarray(specjax.accepted_length(decoder, draft, target))
    context = token_tree_study.context_law(target)
    calls = float(specjax.exact(decoder, draft, target).expected_calls)
    return 1.0 + float(context @ length), length, target.horizon / calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="2;3;2,1;2,2;3,1;1,1,1;2,1,1")
    parser.add_argument("--seeds", default="0,1", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--skip-ngram", action="store_true")
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    trees = [tuple(int(b) for b in t.split(",")) for t in args.trees.split(";")]
    start = time.time()
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average, {os.cpu_count()} cores)")
    print("| instance | tree | nodes | TV | iid | wor | TV - iid | TV - wor | T/E[calls] TV | iid "
          "| wor | ctx TV < iid |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worse = []
    for name, draft, target in instances(args):
        for tree in trees:
            decoders = {"TV": specjax.TraversalVerification(tree),
                        "iid": specjax.TokenTree(tree),
                        "wor": specjax.TokenTree(tree, children="without_replacement")}
            res = {k: values(d, draft, target) for k, d in decoders.items()}
            tv, iid, wor = res["TV"], res["iid"], res["wor"]
            context = token_tree_study.context_law(target)
            below = (tv[1] < iid[1] - 1e-12) & (context > 0)
            print(f"| {name} | {tree} | {decoders['TV'].num_nodes} | {tv[0]:.4f} | {iid[0]:.4f} "
                  f"| {wor[0]:.4f} | {tv[0] - iid[0]:+.4f} | {tv[0] - wor[0]:+.4f} | {tv[2]:.4f} "
                  f"| {iid[2]:.4f} | {wor[2]:.4f} | {int(below.sum())}/{int((context > 0).sum())} |",
                  flush=True)
            for other, value in (("iid", iid), ("wor", wor)):
                if tv[0] < value[0] - 1e-12:
                    worse.append(f"{name} {tree}: tokens/call at position 1 {tv[0]:.4f} < {other} "
                                 f"{value[0]:.4f}")
                if tv[2] < value[2] - 1e-12:
                    worse.append(f"{name} {tree}: T/E[calls] {tv[2]:.4f} < {other} {value[2]:.4f}")
            if below.any():
                gaps = (iid[1] - tv[1])[below]
                worse.append(f"{name} {tree}: {int(below.sum())} contexts of position 1 with a "
                             f"smaller accepted length than iid (largest gap {gaps.max():.4f})")
    print()
    print("Cases where Traversal Verification accepts less:")
    for line in worse or ["none"]:
        print(f"- {line}")
    print(f"\n({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
