"""Speculative decoding with small neural character models (equinox, trained with optax).

Two MLPs over the last ``L`` characters, trained on the characters of the Python standard
library's own source files (present on every machine; read and mapped to ``V`` classes as
``scripts/ngram_demo.py`` does): a draft with ``L = 1`` and a small hidden layer, a target with
``L = 3``. Each is an ``equinox.Module`` that gives logits: ``logits(state)`` for one context and
``logits_block(state, tokens)`` for the ``K + 1`` contexts of a call in one batched evaluation,
its state the index of the last ``L`` characters (``NGramModel``'s convention, padded with class 0
before the start). ``specjax.decode`` takes their softmax (``ProcessedModel``).

The script prints:

1. the exact expected calls and rejections of SD over ``T`` positions on the models' finite-state
   lift (each model evaluated on all ``V**3`` contexts: an n-gram table) beside Monte Carlo on
   the neural models themselves, with the token-wise engine and with batched scoring;
2. a benchmark: chain-steps per second (``C T`` per run, best of ``--repeats``, compilation
   excluded) of the token-wise engine (one draft and one target evaluation per position) and of
   batched scoring (per call, ``K`` draft evaluations and one target evaluation of ``K + 1``
   contexts), the latter with the model's ``logits_block`` and with the scan fallback, for
   several numbers of chains.

Needs equinox (``pip install equinox``).

    python scripts/char_model.py                   # V = 16, T = 32, K = 4
    python scripts/char_model.py --max-bytes 50000 --steps 30 --num-chains 2000 --bench-chains 256
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import specjax
from _timing import best_time
from ngram_demo import character_classes
from ngram_demo import encode
from ngram_demo import read_corpus


class CharMLP(eqx.Module):
    """``P(x_t | last L characters)``: embeddings, one tanh hidden layer, logits.

    A model of specjax's protocol that gives logits (``num_states``, ``init_state``,
    ``logits``, ``update``) and scores a block of contexts at once (``logits_block``).
    """

    embed: jax.Array  # (V, E)
    hidden: eqx.nn.Linear  # L E -> H
    out: eqx.nn.Linear  # H -> V
    context: int = eqx.field(static=True)  # L

    def __init__(self, key, num_states: int, context: int, width: int, hidden: int):
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = 0.1 * jax.random.normal(k1, (num_states, width))
        self.hidden = eqx.nn.Linear(context * width, hidden, key=k2)
        self.out = eqx.nn.Linear(hidden, num_states, key=k3)
        self.context = context

    @property
    def num_states(self) -> int:
        return self.embed.shape[0]

    def init_state(self):
        return jnp.int32(0)  # the last L characters, all class 0 (padding) before the start

    def update(self, state, token):
        keep = self.num_states ** (self.context - 1)
        return (state % keep) * self.num_states + jnp.asarray(token, jnp.int32)

    def contexts_logits(self, contexts):
        """``(N, V)`` logits of ``N`` context indices, in one batched evaluation."""
        powers = self.num_states ** jnp.arange(self.context - 1, -1, -1)
        chars = (contexts[:, None] // powers[None, :]) % self.num_states  # (N, L), oldest first
        x = self.embed[chars].reshape(contexts.shape[0], -1)
        return jax.vmap(self.out)(jnp.tanh(jax.vmap(self.hidden)(x)))

    def logits(self, state):
        return self.contexts_logits(jnp.reshape(state, (1,)))[0]

    def logits_block(self, state, tokens):
        """``(K + 1, V)``: the logits after each prefix of ``tokens``, one evaluation."""
        def step(s, x):
            nxt = self.update(s, x)
            return nxt, nxt

        _, after = jax.lax.scan(step, state, tokens)
        return self.contexts_logits(jnp.concatenate([jnp.reshape(state, (1,)), after]))


class ScanOnly(eqx.Module):
    """The same model without ``logits_block``: batched scoring falls back to a scan."""

    model: CharMLP

    num_states = property(lambda self: self.model.num_states)

    def init_state(self):
        return self.model.init_state()

    def logits(self, state):
        return self.model.logits(state)

    def update(self, state, token):
        return self.model.update(state, token)


def training_pairs(sequences, context: int, num_states: int):
    """``(context index, next class)`` for every position (contexts padded with class 0)."""
    contexts, targets = [], []
    for seq in sequences:
        padded = np.concatenate([np.zeros(context, np.int64), seq.astype(np.int64)])
        index = np.zeros(seq.size, np.int64)
        for k in range(context):
            index = index * num_states + padded[k:k + seq.size]
        contexts.append(index)
        targets.append(seq)
    return np.concatenate(contexts).astype(np.int32), np.concatenate(targets).astype(np.int32)


def train(key, model: CharMLP, contexts, targets, *, steps: int, batch: int, lr: float):
    """Adam on the mean cross-entropy of random batches; returns the model and the last loss."""
    optimizer = optax.adam(lr)
    params, static = eqx.partition(model, eqx.is_array)
    state = optimizer.init(params)

    def loss(params, c, y):
        logits = eqx.combine(params, static).contexts_logits(c)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(params, state, key):
        idx = jax.random.randint(key, (batch,), 0, contexts.shape[0])
        value, grads = jax.value_and_grad(loss)(params, contexts[idx], targets[idx])
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    contexts, targets = jnp.asarray(contexts), jnp.asarray(targets)
    value = jnp.nan
    for key in jax.random.split(key, steps):
        params, state, value = step(params, state, key)
    return eqx.combine(params, static), float(value)


@eqx.filter_jit  # one program (op by op, the batched evaluation compiled about 25)
def _context_table(model: CharMLP):
    """``(V**L, V)``: the model's softmax on every context of length ``L``, in float64."""
    contexts = jnp.arange(model.num_states ** model.context, dtype=jnp.int32)
    return jax.nn.softmax(model.contexts_logits(contexts).astype(jnp.float64), axis=-1)


def finite_state_lift(model: CharMLP, context: int):
    """The model as a ``FiniteStateModel`` over the ``V**context`` contexts (``context >= L``):
    its softmax on every context of length ``L`` is an ``(L + 1)``-gram's table."""
    table = np.asarray(_context_table(model), np.float64)
    table = table / table.sum(-1, keepdims=True)
    return specjax.NGramModel(table=jnp.asarray(table), order=model.context + 1) \
        .as_finite_state(context)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-bytes", type=int, default=400_000)
    parser.add_argument("--states", type=int, default=16, help="V: character classes")
    parser.add_argument("--steps", type=int, default=400, help="training steps per model")
    parser.add_argument("--horizon", type=int, default=32)
    parser.add_argument("--lookahead", type=int, default=4, help="K")
    parser.add_argument("--num-chains", type=int, default=20_000, help="Monte Carlo chains")
    parser.add_argument("--bench-chains", default="16,256,4096,65536",
                        help="comma-separated chain counts of the benchmark")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build(args):
    """The trained draft and target, and their lifts to the target's ``V**3`` contexts."""
    texts = read_corpus(args.max_bytes)
    classes = character_classes(texts, args.states)
    sequences = encode(texts, classes, args.states)
    keys = jax.random.split(jax.random.key(args.seed), 4)
    trained = []
    for key_init, key_train, (context, hidden) in zip(keys[:2], keys[2:], ((1, 16), (3, 128))):
        model = CharMLP(key_init, args.states, context, width=8, hidden=hidden)
        pairs = training_pairs(sequences, context, args.states)
        model, loss = train(key_train, model, *pairs, steps=args.steps, batch=512, lr=3e-3)
        trained.append((model, loss))
    (draft, draft_loss), (target, target_loss) = trained
    with jax.enable_x64(True):
        lifts = finite_state_lift(draft, 3), finite_state_lift(target, 3)
    return draft, target, lifts, (draft_loss, target_loss)


def monte_carlo_rows(args, draft, target, lifts):
    """``(engine, calls, se, exact calls, rejections, se, exact rejections)`` rows."""
    decoder = specjax.Speculative(args.lookahead)
    with jax.enable_x64(True):
        exact = specjax.exact(decoder, *lifts, horizon=args.horizon)
        calls, rejections = float(exact.expected_calls), float(exact.expected_rejections)
    rows = []
    for name, batched in (("token-wise", False), ("batched scoring", True)):
        trace = specjax.decode(jax.random.key(args.seed + 1), decoder, draft, target,
                               args.num_chains, horizon=args.horizon, batched_scoring=batched)
        c = np.asarray(trace.num_calls, np.float64)
        r = np.asarray(trace.num_rejections, np.float64)
        n = c.size
        rows.append((name, c.mean(), c.std(ddof=1) / np.sqrt(n), calls,
                     r.mean(), r.std(ddof=1) / np.sqrt(n), rejections))
    return rows


def benchmark_rows(args, draft, target):
    """``(C, token-wise, batched with logits_block, batched with a scan)`` chain-steps/s."""
    decoder = specjax.Speculative(args.lookahead)
    horizon = args.horizon
    rows = []
    for num_chains in (int(c) for c in args.bench_chains.split(",")):
        cases = ((draft, target, False), (draft, target, True),
                 (ScanOnly(draft), ScanOnly(target), True))
        rates = []
        for d, t, batched in cases:
            def run(i, d=d, t=t, batched=batched):
                return specjax.decode(jax.random.key(i), decoder, d, t, num_chains,
                                      horizon=horizon, batched_scoring=batched).tokens
            rates.append(num_chains * horizon / best_time(run, args.repeats))
        rows.append((num_chains, *rates))
    return rows


def main(argv=None):
    args = parse(argv)
    draft, target, lifts, losses = build(args)
    print(f"V = {args.states}, T = {args.horizon}, SD with K = {args.lookahead}; training "
          f"loss (nats/char): draft (L = 1) {losses[0]:.3f}, target (L = 3) {losses[1]:.3f}")
    print(f"\nExact values on the finite-state lift ({args.states ** 3} states) beside Monte "
          f"Carlo on the neural models ({args.num_chains:,} chains)")
    print("| engine | calls (MC) | exact | z | rejections (MC) | exact | z |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    mc = monte_carlo_rows(args, draft, target, lifts)
    for name, c, cse, cx, r, rse, rx in mc:
        print(f"| {name} | {c:.3f} ± {cse:.3f} | {cx:.3f} | {(c - cx) / cse:+.2f} | "
              f"{r:.3f} ± {rse:.3f} | {rx:.3f} | {(r - rx) / rse:+.2f} |")
    print(f"\nChain-steps per second (C T per run, best of {args.repeats}, "
          f"{jax.devices()[0].platform})")
    print("| chains | token-wise | batched, logits_block | batched, scan | batched / "
          "token-wise |")
    print("| --- | --- | --- | --- | --- |")
    bench = benchmark_rows(args, draft, target)
    for num_chains, plain, block, scan in bench:
        print(f"| {num_chains:,} | {plain:.3g} | {block:.3g} | {scan:.3g} | "
              f"{block / plain:.2f} |")
    return {"losses": losses, "monte_carlo": mc, "benchmark": bench}


if __name__ == "__main__":
    main()
