"""Parallel drafters against sequential drafting, exactly, and whether the accepted length can be
extrapolated over ``K`` from ``K = 1``.

A parallel drafter (DFlash, PARD, reused MTP heads) draws the depth-``i`` token of a call without
seeing the drafts before it (``specjax.decoders.ParallelDraft``). For each ``K`` the table gives,
exactly (float64):

* ``tok/call``: ``1 + E[drafts kept]`` of a call at position 1 (previous token from
  ``target.init``) for ``seq`` (SD with lookahead ``K``: ``Speculative(lookahead=K)``), ``par``
  (``ParallelDraft(K)``: the draft's ``i``-step marginals) and ``heads`` (``ParallelDraft(K,
  heads=...)`` with the *target's* own ``i``-step marginals: what a perfectly trained parallel
  head predicts for depth ``i`` from the last accepted token);
* ``iid(a)``: the i.i.d.-acceptance extrapolation ``(1 - a^(K+1)) / (1 - a)`` with ``a`` the
  acceptance measured at ``K = 1`` (the expected drafts kept at ``K = 1``, the same for ``seq``
  and ``par``, which are both SD there), and its error against each exact value;
* ``E[calls]``: exact expected target calls for the ``T`` tokens, for the three drafters, and
  beside them the Monte Carlo mean of ``par``'s calls (``specjax.decoding_statistics``) with its
  standard error and z-score (the independent reference);
* under the table, the acceptance of each depth given the earlier depths kept, over the whole
  run (``engine_metrics``' ``conditional_acceptance``), at the largest ``K``.

Instances (call-level decoders run on ``MarkovChain``s, so the n-grams are token-level bigrams;
the lifted chain over trigram contexts that ``token_tree_study.py`` uses would not do: its
``i``-step marginal is a law over contexts, which also guesses the drafts before depth ``i``):

1. the paper's (``specjax.paper_instance()``: V = 7, T = 50, draft and target independent random
   chains);
2. n-grams of text: the characters of the standard library's ``*.py`` files (as
   ``ngram_demo.py`` reads them) in ``--classes`` classes (the most frequent characters, newline
   first, the rest OTHER); the target a bigram of the whole text, the draft a bigram of its first
   ``--draft-share`` (interpolated towards the unigram with ``--draft-backoff``), both
   stationary (the target's stationary law at ``x_0``), T = ``--horizon``.

    python scripts/study_parallel_draft.py                 # K = 1..8, 4,000 chains
    python scripts/study_parallel_draft.py --max-k 3 --num-chains 200 --max-bytes 20000
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.decoders import ParallelDraft
from specjax.decoders import marginal_heads
from specjax.models.ngram import NGramModel

SCRIPTS = pathlib.Path(__file__).resolve().parent


def _script(name):
    sys.path.insert(0, str(SCRIPTS))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def stationary(trans: np.ndarray) -> np.ndarray:
    """The stationary law of an irreducible transition matrix, by power iteration."""
    law = np.full(trans.shape[0], 1.0 / trans.shape[0])
    for _ in range(100_000):
        new = law @ trans
        if np.abs(new - law).max() < 1e-15:
            break
        law = new
    return new / new.sum()


def chain(init, table, horizon):
    return specjax.MarkovChain(jnp.asarray(init, jnp.float64), jnp.asarray(
        np.broadcast_to(table, (horizon,) + table.shape), jnp.float64))


def paper_instance():
    # Drawn in float32 (the instance every guide uses: under x64 the same seed draws other
    # chains), then cast to float64 for the exact values.
    with jax.enable_x64(False):
        draft, target = specjax.paper_instance()

    def cast(model):  # float64 rows, renormalised (float32 rows miss 1 by ~1e-7)
        rows = [np.asarray(x, np.float64) for x in (model.init, model.trans)]
        return specjax.MarkovChain(*(jnp.asarray(x / x.sum(-1, keepdims=True)) for x in rows))

    return cast(draft), cast(target), "paper instance: V = 7, T = 50 (independent random chains)"


def ngram_instance(args):
    demo = _script("ngram_demo")
    texts = demo.read_corpus(args.max_bytes)
    classes = demo.character_classes(texts, args.classes)
    seqs = demo.encode(texts, classes, args.classes)
    whole = np.concatenate(seqs)
    part = whole[:max(2, int(args.draft_share * whole.size))]
    fit = dict(order=2, num_states=args.classes, smoothing=0.5)
    target = np.asarray(NGramModel.fit([whole], backoff=2.0, **fit).table, np.float64)
    draft = np.asarray(NGramModel.fit([part], backoff=args.draft_backoff, **fit).table,
                       np.float64)
    pi = stationary(target)
    text = (f"n-grams: {whole.size:,} stdlib characters in V = {args.classes} classes; target "
            f"bigram of all, draft bigram of the first {part.size:,} (backoff "
            f"{args.draft_backoff}); stationary, T = {args.horizon}")
    return chain(pi, draft, args.horizon), chain(pi, target, args.horizon), text


def tokens_per_call(decoder, draft, target) -> float:
    kept = np.asarray(specjax.accepted_length(decoder, draft, target, position=1), np.float64)
    return 1.0 + float(np.asarray(target.init, np.float64) @ kept)


def study(draft, target, args, key):
    """Rows of the table, one per ``K``: a dict of the numbers."""
    rows = []
    a = tokens_per_call(specjax.Speculative(lookahead=1), draft, target) - 1.0
    for k in range(1, args.max_k + 1):
        decoders = {"seq": specjax.Speculative(lookahead=k), "par": ParallelDraft(k),
                    "heads": ParallelDraft(k, heads=marginal_heads(target.trans, k))}
        row = {"K": k, "a": a, "iid": (k + 1.0) if a == 1 else (1 - a ** (k + 1)) / (1 - a)}
        for name, decoder in decoders.items():
            row[f"{name} tpc"] = tokens_per_call(decoder, draft, target)
            row[f"{name} calls"] = float(specjax.exact(decoder, draft, target).expected_calls)
        sim = specjax.decoding_statistics(jax.random.fold_in(key, k), decoders["par"], draft,
                                          target, args.num_chains)
        calls = np.asarray(sim.num_calls, np.float64)
        row["mc calls"] = calls.mean()
        row["mc se"] = calls.std(ddof=1) / np.sqrt(calls.size)
        row["z"] = (row["mc calls"] - row["par calls"]) / max(row["mc se"], 1e-12)
        rows.append(row)
    return rows


HEADER = (f"{'K':>2} | {'seq':>6} {'par':>6} {'heads':>6} | {'iid(a)':>6} {'-seq':>6} "
          f"{'-par':>6} | {'seq':>7} {'par':>7} {'heads':>7} | {'par MC +- se':>16} {'z':>5}")


def format_rows(rows) -> str:
    lines = [f"{'':>2} | {'tokens per call (exact)':^20} | {'i.i.d. extrapolation':^20} | "
             f"{'E[calls] for T tokens (exact)':^23} | {'par, Monte Carlo':^22}", HEADER,
             "-" * len(HEADER)]
    for r in rows:
        lines.append(
            f"{r['K']:>2} | {r['seq tpc']:6.3f} {r['par tpc']:6.3f} {r['heads tpc']:6.3f} | "
            f"{r['iid']:6.3f} {r['iid'] - r['seq tpc']:+6.3f} {r['iid'] - r['par tpc']:+6.3f} | "
            f"{r['seq calls']:7.3f} {r['par calls']:7.3f} {r['heads calls']:7.3f} | "
            f"{r['mc calls']:8.3f} +- {r['mc se']:5.3f} {r['z']:+5.2f}")
    return "\n".join(lines)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--num-chains", type=int, default=4_000)
    parser.add_argument("--max-bytes", type=int, default=300_000)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--draft-share", type=float, default=0.02)
    parser.add_argument("--draft-backoff", type=float, default=20.0)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--skip-ngram", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)  # the exact values in float64
    key = jax.random.key(args.seed)
    instances = [paper_instance] + ([] if args.skip_ngram else [lambda: ngram_instance(args)])
    results = {}
    for make in instances:
        start = time.perf_counter()
        draft, target, text = make()
        rows = study(draft, target, args, key)
        results[text] = rows
        print(f"\n{text}; a = {rows[0]['a']:.4f} at K = 1 "
              f"({time.perf_counter() - start:.1f} s)")
        print(format_rows(rows))
        print(depth_acceptance(draft, target, args.max_k))
    return results


def depth_acceptance(draft, target, lookahead: int) -> str:
    """The acceptance of each depth given the depths before it kept (over the whole run:
    ``specjax.theory.engine_metrics``' ``conditional_acceptance``), sequential and parallel."""
    lines = [f"acceptance per depth given the earlier depths kept, K = {lookahead}:"]
    for name, decoder in (("seq", specjax.Speculative(lookahead=lookahead)),
                          ("par", ParallelDraft(lookahead))):
        rates = specjax.theory.engine_metrics(decoder, draft, target).conditional_acceptance
        lines.append(f"  {name}: " + " ".join(f"{float(r):.3f}" for r in rates))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
