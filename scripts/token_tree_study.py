"""Token trees against their budget: chains, stars, Sequoia's tree, EAGLE-2's dynamic tree and the
speed of light, exactly and simulated, on two instances.

For each budget ``P`` (nodes per target call, root included) the table gives the exact tokens per
call ``1 + E[drafts kept]`` of a call at position 1 (the previous token from the target's law of
``x_0``), for:

* ``chain``: ``TokenTree((1,) * (P - 1))``, i.e. SD with lookahead ``P - 1`` (checked equal to
  ``Speculative(lookahead=P - 1)``);
* ``star iid`` / ``star wor``: ``TokenTree((P - 1,))`` with i.i.d. children and without
  replacement;
* ``Sequoia``: Sequoia's dynamic program (``sequoia_tree``) on the exact positional acceptance
  vector (``positional_acceptance(children="without_replacement")``), its own prediction
  (``DP``) and the exact value of its tree (``TokenTree.from_parents(..., "without_replacement")``);
* ``best``: for ``P <= --max-search`` the best tree by exhaustive search (``best_token_tree``,
  without replacement);
* ``EAGLE-2``: ``DynamicTree(P, max_depth=D)`` (the draft ranks the prefixes) and the speed of
  light ``DynamicTree(P, max_depth=D, rank="target")``: the best *deterministic* tree of ``P``
  nodes; ``D = min(P - 1, --max-depth)`` for these and for Sequoia's tree.

Then ``ratio = (speed of light - 1) / (log P / H)`` with ``H`` the target's mean next-token
entropy (nats) under its marginal law of contexts: Pankratov & Alistarh (2025) predict that the
best deterministic tree's accepted length grows like ``log(P) / H``. Then, for ``--sim-budgets``,
whole decodes of ``T`` tokens: exact ``E[calls]`` (``specjax.exact``) beside Monte Carlo
(``specjax.decoding_statistics``, mean +- standard error) and ``T / E[calls]``.

Instances:

1. the paper's (``specjax.paper_instance()``: V = 7, T = 50, uniform prompt);
2. n-grams of text: the characters of the standard library's ``*.py`` files (as
   ``scripts/ngram_demo.py`` reads them) in ``--classes`` = 4 classes (whitespace, lower-case
   letters, upper-case letters / digits / underscore, other), a bigram draft and a trigram
   target, lifted to a ``MarkovChain`` over the trigram's contexts (state = the last two tokens,
   ``S = V^2``; from ``(a, b)`` to ``(b, y)`` with probability ``table[(a, b), y]``). Each state
   determines its token (its second half) and the path of states is a function of the tokens,
   so trees over the lifted chain are trees over the n-grams (the smoke test checks that SD's
   expected calls on the lifted chain equal ``specjax.exact`` on the n-grams' finite-state
   models). The n-grams start after padding (a degenerate context), so the lifted chain here
   starts from the target's *stationary* law of contexts and is stationary: position 1 is a
   typical position of a long text. Why 4 classes: the exact law of children drawn without
   replacement enumerates ``S^b`` paths over the lifted chain's ``S`` states (the library does
   not exploit that only ``V`` of them follow a context), refused beyond ``2^26`` elements; at
   ``V = 4`` (``S = 16``) every node can carry its ``V`` useful children. A child of rank above
   the number of tokens ``V`` is never drafted without replacement (the draft law is exhausted),
   so stars and Sequoia's trees are cut to ``V`` children per node: same exact value. The
   exhaustive search stops at ``P = 6`` there (``S^(P-1)`` paths).

Figure ``token_trees.png``: tokens per call against ``P`` (log2 axis), one panel per instance;
markers with error bars: simulated ``T / E[calls]`` over the whole horizon (open markers: exact),
which is below the position-1 value by the calls cut short at the horizon.

Usage: python scripts/token_tree_study.py [--out docs/token_trees.png] [--num-chains 20000]
       [--budgets 1,2,3,4,6,8,12,16,24,32,48,64] [--sim-budgets 4,16] [--skip-ngram]
       tiny: --budgets 1,2,4 --sim-budgets 4 --num-chains 200 --skip-ngram
The default run takes about 5 minutes on 2 CPU cores (float64; most of it compiling and
simulating the dynamic trees).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.models.autoregressive import NGramModel

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMES = ("chain", "star iid", "star wor", "Sequoia", "EAGLE-2", "speed of light")
SIMULATED = ("chain", "Sequoia", "EAGLE-2", "speed of light")


# ----------------------------------------------------------------------------------- instances

def lift(model, horizon: int, init=None) -> specjax.MarkovChain:
    """A ``FiniteStateModel`` as a ``MarkovChain`` over its ``S`` states: ``trans[s, s']`` sums
    ``table[s, x]`` over the tokens ``x`` with ``next_state[s, x] = s'`` (the same matrix at every
    position). ``init`` defaults to the law of the state after ``x_0`` (``x_0 ~ table[start]``)."""
    table = np.asarray(model.table, np.float64)
    nxt = np.asarray(model.next_state)
    num_contexts = table.shape[0]
    trans = np.zeros((num_contexts, num_contexts))
    np.add.at(trans, (np.repeat(np.arange(num_contexts), table.shape[1]), nxt.reshape(-1)),
              table.reshape(-1))
    if init is None:
        init = np.zeros(num_contexts)
        np.add.at(init, nxt[model.start], table[model.start])
    return specjax.MarkovChain(jnp.asarray(init),
                               jnp.asarray(np.broadcast_to(trans, (horizon,) + trans.shape)))


def stationary(trans: np.ndarray) -> np.ndarray:
    """The stationary law of a (irreducible) transition matrix, by power iteration."""
    law = np.full(trans.shape[0], 1.0 / trans.shape[0])
    for _ in range(10_000):
        new = law @ trans
        if np.abs(new - law).max() < 1e-15:
            break
        law = new
    return new / new.sum()


def char_class(c: str) -> int:
    """0 whitespace, 1 lower-case letter, 2 upper-case letter, digit or underscore, 3 other."""
    if c.isspace():
        return 0
    if c.isascii() and c.islower():
        return 1
    if c.isascii() and (c.isupper() or c.isdigit() or c == "_"):
        return 2
    return 3


def read_corpus(max_bytes: int) -> list[str]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ngram_demo
    finally:
        sys.path.pop(0)
    return ngram_demo.read_corpus(max_bytes)


def ngram_models(max_bytes: int, num_classes: int = 4):
    """Bigram draft and trigram target (interpolated, as ``ngram_demo``) on character classes;
    returns ``(draft, target)`` ``NGramModel``s and the number of characters."""
    if num_classes != 4:
        raise ValueError("--classes: only the 4 classes of char_class are defined")
    texts = read_corpus(max_bytes)
    lookup = np.full(0x110000, 3, np.int32)
    for code in range(0x80):
        lookup[code] = char_class(chr(code))
    seqs = [lookup[np.frombuffer(t.encode("utf-32-le"), np.uint32)] for t in texts]
    fit = {"num_states": num_classes, "smoothing": 0.5, "backoff": 2.0}
    draft = NGramModel.fit(seqs, order=2, **fit)
    target = NGramModel.fit(seqs, order=3, **fit)
    return draft, target, sum(s.size for s in seqs)


def ngram_instance(max_bytes: int, horizon: int, num_classes: int = 4):
    """The lifted stationary chains ``(draft, target)`` and a description."""
    draft, target, chars = ngram_models(max_bytes, num_classes)
    draft_fs, target_fs = draft.as_finite_state(2), target.as_finite_state(2)
    q = lift(target_fs, horizon)
    pi = stationary(np.asarray(q.trans[0]))
    text = (f"n-grams: {chars:,} stdlib characters in V = {num_classes} classes, bigram draft, "
            f"trigram target, lifted to S = {num_classes ** 2} context states, stationary, "
            f"T = {horizon}")
    title = f"n-grams of stdlib text (V = {num_classes}, S = {num_classes ** 2}, T = {horizon})"
    return lift(draft_fs, horizon, pi), lift(target_fs, horizon, pi), text, title


# --------------------------------------------------------------------------------- quantities

def context_law(target, position: int = 1) -> np.ndarray:
    law = np.asarray(target.init, np.float64)
    for n in range(position - 1):
        law = law @ np.asarray(target.trans[n], np.float64)
    return law


def tokens_per_call(decoder, draft, target) -> float:
    """``1 + E[drafts kept]`` of a call at position 1, the previous token from ``target.init``."""
    kept = np.asarray(specjax.accepted_length(decoder, draft, target, position=1), np.float64)
    return 1.0 + float(context_law(target) @ kept)


def mean_entropy(target) -> float:
    """Mean next-token entropy (nats) of the target over positions ``1..T``, each context drawn
    from the target's marginal law."""
    law = np.asarray(target.init, np.float64)
    total = 0.0
    for trans in np.asarray(target.trans, np.float64):
        logs = np.log(np.where(trans > 0, trans, 1.0))
        total += float(law @ -(trans * logs).sum(-1))
        law = law @ trans
    return total / target.horizon


def support_size(draft) -> int:
    """The most tokens the draft gives positive probability after one context (the ranks
    beyond it are never drafted without replacement)."""
    return int((np.asarray(draft.trans) > 0).sum(-1).max())


def cut_children(parents, max_children: int) -> tuple:
    """The tree without the children of rank above ``max_children`` (and their subtrees),
    renumbered: a child that is never drafted adds nothing to the exact value."""
    keep, rank, new_index = [], {}, {}
    for i, parent in enumerate(parents):
        if i == 0:
            keep.append(-1)
            new_index[0] = 0
            continue
        if parent not in new_index:
            continue
        rank[parent] = rank.get(parent, 0) + 1
        if rank[parent] > max_children:
            continue
        new_index[i] = len(keep)
        keep.append(new_index[parent])
    return tuple(keep)


def sequoia(draft, target, budget: int, max_depth: int, cap: int):
    """Sequoia's DP value and tree (cut to ``cap`` children per node) for ``budget`` nodes."""
    num = min(budget - 1, cap)
    acc = np.asarray(specjax.theory.positional_acceptance(
        draft, target, num_children=num, children="without_replacement"), np.float64)
    acc = np.concatenate([acc, np.zeros(budget - 1 - num)])  # exact: ranks > cap are never drafted
    value, parents = specjax.sequoia_tree(acc, budget=budget, max_depth=max_depth)
    return value, cut_children(parents, cap)


def decoders(budget: int, max_depth: int, cap: int, sequoia_parents) -> dict:
    depth = min(budget - 1, max_depth)
    width = min(budget - 1, cap)
    return {
        "chain": specjax.TokenTree((1,) * (budget - 1)),
        "star iid": specjax.TokenTree((budget - 1,)),
        "star wor": specjax.TokenTree((width,), children="without_replacement"),
        "Sequoia": specjax.TokenTree.from_parents(sequoia_parents,
                                                  children="without_replacement"),
        "EAGLE-2": specjax.DynamicTree(budget, max_depth=depth),
        "speed of light": specjax.DynamicTree(budget, max_depth=depth, rank="target"),
    }


def study(name, draft, target, args, key):
    """Tables of one instance; returns its rows (one dict per budget) and simulated rows."""
    cap = support_size(draft)
    entropy = mean_entropy(target)
    max_search = min(args.max_search, 6 if cap ** 2 == draft.num_states else args.max_search)
    rows, sims = [], []
    for budget in args.budgets:
        row = {"budget": budget}
        if budget == 1:  # the root alone: one token per call, whatever the scheme
            row.update({s: 1.0 for s in SCHEMES}, sequoia_dp=1.0, best=1.0, ratio=math.nan)
            rows.append(row)
            continue
        depth = min(budget - 1, args.max_depth)
        row["sequoia_dp"], parents = sequoia(draft, target, budget, depth, cap)
        row["sequoia_parents"] = parents
        decs = decoders(budget, args.max_depth, cap, parents)
        for scheme, dec in decs.items():
            row[scheme] = tokens_per_call(dec, draft, target)
        row["sd"] = tokens_per_call(specjax.Speculative(lookahead=budget - 1), draft, target)
        if budget <= max_search:
            row["best"], row["best_parents"] = specjax.theory.best_token_tree(
                draft, target, budget=budget, max_depth=depth, children="without_replacement")
        row["ratio"] = (row["speed of light"] - 1) / (math.log(budget) / entropy)
        rows.append(row)
        if budget in args.sim_budgets:
            for scheme in SIMULATED:
                dynamic = isinstance(decs[scheme], specjax.DynamicTree)
                chains = args.dynamic_chains if dynamic else args.num_chains
                key, sub = jax.random.split(key)
                stats = specjax.decoding_statistics(sub, decs[scheme], draft, target, chains)
                calls = np.asarray(stats.num_calls, np.float64)
                exact = float(specjax.exact(decs[scheme], draft, target).expected_calls)
                sims.append({"budget": budget, "scheme": scheme, "chains": chains, "exact": exact,
                                 "mean": calls.mean(), "se": calls.std(ddof=1) / np.sqrt(calls.size)})

    print(f"\n== {name}\n   H = {entropy:.4f} nats (mean next-token entropy of the target); "
          f"D = min(P - 1, {args.max_depth}); tokens per call 1 + E[kept] at position 1")
    header = (f"{'P':>4}{'chain':>8}{'star iid':>9}{'star wor':>9}{'Seq. DP':>9}{'Sequoia':>9}"
              f"{'best':>8}{'EAGLE-2':>9}{'SoL':>8}{'ratio':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        best = f"{r['best']:>8.3f}" if "best" in r else f"{'-':>8}"
        print(f"{r['budget']:>4}{r['chain']:>8.3f}{r['star iid']:>9.3f}{r['star wor']:>9.3f}"
              f"{r['sequoia_dp']:>9.3f}{r['Sequoia']:>9.3f}{best}{r['EAGLE-2']:>9.3f}"
              f"{r['speed of light']:>8.3f}{r['ratio']:>7.3f}")
    gap = max((abs(r["chain"] - r["sd"]) for r in rows if "sd" in r), default=0.0)
    print(f"   chain vs Speculative(lookahead=P - 1): largest difference {gap:.1e}")
    searched = [r for r in rows if "best_parents" in r]
    if searched:
        print("\n   Sequoia's pick beside the best tree (exhaustive search, without replacement)")
        for r in searched:
            print(f"   P = {r['budget']:>2}: DP {r['sequoia_dp']:.4f}, exact {r['Sequoia']:.4f} "
                  f"{r['sequoia_parents']}; best {r['best']:.4f} {r['best_parents']}; "
                  f"gap {r['best'] - r['Sequoia']:.4f}")
    beaten = [(r["budget"], s) for r in rows if r["budget"] > 1 for s in SCHEMES
              if r[s] > r["speed of light"] + 1e-9]
    if beaten:
        print("\n   above the speed of light (a deterministic-tree bound; random drafts may pass it):"
              f" {', '.join(f'{s} at P = {p}' for p, s in beaten)}")
    if sims:
        horizon = target.horizon
        print(f"\n   whole decodes of T = {horizon}: E[calls] exact vs simulated (mean +- se), "
              "T / E[calls]")
        for s in sims:
            z = (s["mean"] - s["exact"]) / s["se"] if s["se"] > 0 else 0.0
            print(f"   P = {s['budget']:>2} {s['scheme']:<15}{s['exact']:>9.3f}{s['mean']:>9.3f} +- "
                  f"{s['se']:<6.3f} (z = {z:+.2f}, {s['chains']:,} chains)   "
                  f"{horizon / s['exact']:.3f} vs {horizon / s['mean']:.3f}")
    return {"name": name, "rows": rows, "sims": sims, "entropy": entropy, "horizon": target.horizon}


# -------------------------------------------------------------------------------------- figure

def plot(results, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), squeeze=False)
    colors = dict(zip(SCHEMES, ("C0", "C1", "C2", "C3", "C4", "k")))
    for ax, res in zip(axes[0], results):
        budgets = [r["budget"] for r in res["rows"]]
        for scheme in SCHEMES:
            ax.plot(budgets, [r[scheme] for r in res["rows"]], marker=".", color=colors[scheme],
                    linestyle="--" if scheme == "speed of light" else "-", label=scheme)
        best = [(r["budget"], r["best"]) for r in res["rows"] if "best" in r]
        if best:
            ax.plot(*zip(*best), "x", color="C3", label="best tree (search)")
        for s in res["sims"]:
            tokens = res["horizon"] / s["mean"]
            err = res["horizon"] * s["se"] / s["mean"] ** 2
            ax.errorbar([s["budget"]], [tokens], yerr=[err], fmt="s", ms=4, capsize=3,
                        color=colors[s["scheme"]])
            ax.plot([s["budget"]], [res["horizon"] / s["exact"]], "o", mfc="none", ms=8,
                    color=colors[s["scheme"]])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget P (nodes per call, root included)")
        ax.set_ylabel("tokens per call")
        ax.set_title(res["name"], fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [plt.errorbar([], [], yerr=[], fmt="s", ms=4, color="gray"),
                plt.Line2D([], [], marker="o", mfc="none", ms=8, color="gray", linestyle="")]
    labels += ["T / E[calls], simulated (+- se)", "T / E[calls], exact"]
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)
    parser.add_argument("--budgets", type=ints, default=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64))
    parser.add_argument("--sim-budgets", type=ints, default=(4, 16))
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--max-search", type=int, default=8, help="largest exhaustive search")
    parser.add_argument("--num-chains", type=int, default=20_000)
    parser.add_argument("--dynamic-chains", type=int, default=2_000,
                        help="chains for the dynamic trees (their sampler is slow on CPU)")
    parser.add_argument("--classes", type=int, default=4)
    instance_arguments(parser, ROOT / "docs" / "token_trees.png")
    return parser.parse_args(argv)


def instance_arguments(parser, out: pathlib.Path) -> None:
    """The arguments ``run_instances`` reads (the n-gram instance, the key, the figure's path).
    Shared with ``adaptive_study.py``."""
    parser.add_argument("--horizon", type=int, default=32, help="T of the n-gram instance")
    parser.add_argument("--max-bytes", type=int, default=1_000_000)
    parser.add_argument("--skip-ngram", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=out)


def main(argv=None):
    args = parse(argv)
    with jax.enable_x64(True):  # float64 throughout; the previous setting is restored
        return _run(args)


def _run(args):
    return run_instances(args, study, plot, num_classes=args.classes)


def run_instances(args, study, plot, *, num_classes: int = 4):
    """Runs ``study(name, draft, target, args, key)`` on the paper's instance and, unless
    ``args.skip_ngram``, on the n-gram instance (``args.max_bytes``, ``args.horizon``), then
    ``plot(results, args.out)``; returns the results. Shared with ``adaptive_study.py``."""
    start = time.perf_counter()
    key = jax.random.key(args.seed)
    instances = [("paper's instance (V = 7, T = 50)", specjax.paper_instance)]
    if not args.skip_ngram:
        instances.append(("n-gram", lambda: ngram_instance(args.max_bytes, args.horizon,
                                                           num_classes)))
    results = []
    for name, make in instances:
        made = make()
        draft, target = made[:2]
        if len(made) > 2:
            print(made[2])
            name = made[3]
        key, sub = jax.random.split(key)
        results.append(study(name, draft, target, args, sub))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.out)
    print(f"\nwrote {args.out} ({time.perf_counter() - start:.1f} s)")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
