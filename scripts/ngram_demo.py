"""Speculative decoding with n-gram models of real text: exact costs beside Monte Carlo.

The corpus is the characters of the Python standard library's own source files (present on every
machine): the ``*.py`` files directly under ``sysconfig.get_paths()["stdlib"]``, sorted by name,
read until ``--max-bytes``. Characters are mapped to ``V`` classes (the ``V - 1`` most frequent,
newline first so that the n-grams' start padding, token 0, reads as "after a newline", and
OTHER last). The last ``--holdout`` share of the files is held out to report bits per character.

A bigram draft and a 4-gram target (interpolated with lower orders) are lifted to the 4-gram's
``V**3`` context states; for each decoder the table gives the exact expected rejections and target
calls over ``T`` positions (the exact functions on the lifted models), the acceleration
``T / E[calls]`` and the Monte Carlo values with standard errors (the samplers on the n-grams
themselves). ``g4`` drafts greedily (the bigram's argmax, as n-gram lookup drafting does).

    python scripts/ngram_demo.py                      # V = 32, T = 64, 20,000 chains
    python scripts/ngram_demo.py --max-bytes 100000 --states 8 --horizon 8 --num-chains 500
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import sysconfig
import time

import jax
import numpy as np

import specjax
from specjax.models.autoregressive import NGramModel


def read_corpus(max_bytes: int) -> list[str]:
    """The texts of the standard library's top-level ``*.py`` files, by name, up to
    ``max_bytes`` characters in all (the last file is cut)."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")[:max_bytes - total]
        if text:
            texts.append(text)
            total += len(text)
        if total >= max_bytes:
            break
    if not texts:
        raise RuntimeError(f"no *.py files found under {stdlib}")
    return texts


def character_classes(texts: list[str], num_states: int) -> dict[str, int]:
    """Class of each of the ``V - 1`` most frequent characters (ties by code point), newline
    first; every other character is class ``V - 1`` (OTHER)."""
    counts = collections.Counter()
    for text in texts:
        counts.update(text)
    top = sorted(counts, key=lambda c: (-counts[c], c))[:num_states - 1]
    if "\n" in top:
        top.remove("\n")
        top.insert(0, "\n")
    return {c: i for i, c in enumerate(top)}


def encode(texts: list[str], classes: dict[str, int], num_states: int) -> list[np.ndarray]:
    """Each text as an int32 array of character classes."""
    lookup = np.full(0x110000, num_states - 1, np.int32)  # every code point; OTHER by default
    for c, i in classes.items():
        lookup[ord(c)] = i
    return [lookup[np.frombuffer(t.encode("utf-32-le"), np.uint32)] for t in texts]


def bits_per_token(model: NGramModel, sequences) -> float:
    """Mean ``-log2 P(x_t | context)`` over held-out sequences (contexts padded with token 0)."""
    v, k = model.num_states, model.order - 1
    table = np.asarray(model.table, np.float64)
    total, count = 0.0, 0
    for seq in sequences:
        padded = np.concatenate([np.zeros(k, np.int64), seq.astype(np.int64)])
        ctx = np.zeros(seq.size, np.int64)
        for j in range(k):
            ctx = ctx * v + padded[j:j + seq.size]
        total -= np.log2(table[ctx, seq]).sum()
        count += seq.size
    return total / max(count, 1)




def exact_of(decoder_type):
    """``exact`` of the decoder ``decoder_type(**settings)``, settings as the sampler's."""
    return lambda draft, target, *, horizon, **settings: specjax.exact(
        decoder_type(**settings), draft, target, horizon=horizon)


SD = (specjax.speculative_decoding, exact_of(specjax.Speculative))
BATCH = (specjax.batch_speculative_decoding, exact_of(specjax.BatchSpeculative))
DECODERS = {  # name: (label, (sampler, exact function), keyword arguments, greedy draft?)
    "sd": ("SD, K = T", SD, {}, False),
    "k2": ("SD, K = 2", SD, dict(lookahead=2), False),
    "k4": ("SD, K = 4", SD, dict(lookahead=4), False),
    "k8": ("SD, K = 8", SD, dict(lookahead=8), False),
    "m2": ("batch SD, M = 2", BATCH, dict(num_drafts=2), False),
    "m4": ("batch SD, M = 4", BATCH, dict(num_drafts=4), False),
    "g4": ("greedy draft, K = 4", SD, dict(lookahead=4), True),
}


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-bytes", type=int, default=3_000_000)
    parser.add_argument("--states", type=int, default=32, help="V: character classes")
    parser.add_argument("--draft-order", type=int, default=2)
    parser.add_argument("--target-order", type=int, default=4)
    parser.add_argument("--smoothing", type=float, default=0.5, help="additive, unigram level")
    parser.add_argument("--backoff", type=float, default=2.0, help="interpolation strength")
    parser.add_argument("--holdout", type=float, default=0.1, help="share of files held out")
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--num-chains", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decoders", default=",".join(DECODERS),
                        help=f"comma-separated subset of {','.join(DECODERS)}")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    names = args.decoders.split(",")
    unknown = [name for name in names if name not in DECODERS]
    if unknown:
        raise SystemExit(f"unknown decoders {unknown}; choose from {','.join(DECODERS)}")
    start = time.perf_counter()
    texts = read_corpus(args.max_bytes)
    classes = character_classes(texts, args.states)
    sequences = encode(texts, classes, args.states)
    num_train = max(1, int(round(len(sequences) * (1 - args.holdout))))
    train, held_out = sequences[:num_train], sequences[num_train:]
    fit = dict(num_states=args.states, smoothing=args.smoothing, backoff=args.backoff)
    draft = NGramModel.fit(train, order=args.draft_order, **fit)
    target = NGramModel.fit(train, order=args.target_order, **fit)
    context = max(args.draft_order, args.target_order) - 1
    draft_fs, target_fs = draft.as_finite_state(context), target.as_finite_state(context)

    shown = repr("".join(list(classes)[:12]))
    print(f"corpus: {sum(s.size for s in sequences):,} characters from {len(sequences)} stdlib "
          f"files ({sum(s.size for s in train):,} for fitting); V = {args.states} classes "
          f"(most frequent: {shown} ..., OTHER)")
    if held_out:
        print(f"held-out bits/char: draft ({args.draft_order}-gram) "
              f"{bits_per_token(draft, held_out):.3f}, target ({args.target_order}-gram) "
              f"{bits_per_token(target, held_out):.3f}")
    print(f"lifted to S = {args.states}**{context} = {args.states ** context:,} context states; "
          f"T = {args.horizon}, {args.num_chains:,} chains\n")

    header = (f"{'decoder':<20}{'E[N_rej]':>10}{'simulated':>18}{'E[calls]':>10}"
              f"{'simulated':>18}{'T/E[calls]':>12}")
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    rows = []
    for label, (sampler, exact_fn), kw, greedy in (DECODERS[name] for name in names):
        drafts = (specjax.models.greedy_draft(draft),
                  specjax.models.greedy_draft(draft_fs)) if greedy else (
            draft, draft_fs)
        exact = exact_fn(drafts[1], target_fs, horizon=args.horizon, **kw)
        trace = sampler(key, drafts[0], target, args.num_chains, horizon=args.horizon, **kw)
        rej = np.asarray(trace.num_rejections, np.float64)
        calls = np.asarray(trace.num_calls, np.float64)
        row = dict(decoder=label,
                   exact_rejections=float(exact.expected_rejections),
                   simulated_rejections=rej.mean(),
                   rejections_se=rej.std(ddof=1) / np.sqrt(rej.size),
                   exact_calls=float(exact.expected_calls),
                   simulated_calls=calls.mean(),
                   calls_se=calls.std(ddof=1) / np.sqrt(calls.size))
        row["acceleration"] = args.horizon / row["exact_calls"]
        rows.append(row)
        print(f"{label:<20}{row['exact_rejections']:>10.3f}"
              f"{row['simulated_rejections']:>10.3f} ± {row['rejections_se']:<5.3f}"
              f"{row['exact_calls']:>10.3f}{row['simulated_calls']:>10.3f} ± "
              f"{row['calls_se']:<5.3f}{row['acceleration']:>12.2f}")
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
