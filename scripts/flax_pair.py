"""A real architecture end to end: two flax transformers as a draft/target pair.

Two small causal transformers written with the ecosystem's own layers (``flax.nnx``:
``Embed``, ``MultiHeadAttention`` with a causal mask, ``LayerNorm``, ``Linear``), randomly
initialised from a config and trained with optax on the character corpus of the neural-model
guide (the Python standard library's own source, mapped to ``V`` classes as
``scripts/ngram_demo.py`` does): a target and a smaller draft (fewer layers, narrower). Then, as a
user of "Real model pairs" would:

1. record target rollouts (``specjax.record``) and estimate SD at several lookaheads and batch
   SD (``specjax.estimate``, with standard errors, under a ``CostModel``);
2. choose ``K`` (``specjax.pairs.best_lookahead``);
3. distill the draft for SD(``K``)'s expected time on other rollouts
   (``specjax.pairs.distill.decoding_objective``), record the same rollouts again with the
   distilled draft (the rollouts are the target's: the same key gives the same tokens) and
   re-estimate;
4. the same through an engine user's dump: both networks' rows along the recorded tokens, from
   one batched forward over the sequences, written with ``np.savez``, loaded back with NumPy and
   read by ``Recording.from_arrays``: its estimates equal the direct ones.

Where every sequence can be enumerated (``V**(T + 1)`` small, e.g. ``--tiny``), the networks also
get exact values: each is lifted to a ``FiniteStateModel`` on the prefix tree (a state per prefix
``x_0..x_{t-1}``, its row the network's law of ``x_t``), ``specjax.exact`` and
``specjax.expected_time`` run on the lift, and ``Recording.from_arrays`` over every sequence
weighted by its target probability gives the same numbers (with ``--x64``, to 1e-10).

A network is a specjax protocol model through a small pytree wrapper (``TransformerModel``): its
state is the window of tokens seen so far (a BOS token first) and the position; ``logits``
evaluates the window causally, ``logits_block`` scores the ``K + 1`` contexts of a call in one
forward pass. Needs flax (``pip install flax``); the library itself does not import it.

    python scripts/flax_pair.py            # V = 16, T = 32: a few minutes on a 2-core CPU
    python scripts/flax_pair.py --tiny     # V = 8, T = 3, with exact values (the test's run)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import specjax  # noqa: E402
from ngram_demo import character_classes  # noqa: E402
from ngram_demo import encode  # noqa: E402
from ngram_demo import read_corpus  # noqa: E402
from specjax.pairs.distill import decoding_objective  # noqa: E402

#: The largest number of enumerated sequences ``V**(T + 1)`` for the exact values.
MAX_ENUMERATED = 1 << 17


# ---------------------------------------------------------------------------------------------
# The networks (flax.nnx).


class Block(nnx.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP, each residual."""

    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, h, mask):
        h = h + self.attention(self.norm1(h), mask=mask)
        return h + self.down(jax.nn.gelu(self.up(self.norm2(h))))


class CharTransformer(nnx.Module):
    """``(N, n)`` token ids (``V`` is BOS) -> ``(N, n, V)`` next-token logits, ``n <= length``."""

    def __init__(self, num_states: int, length: int, width: int, heads: int, layers: int, *,
                 rngs: nnx.Rngs):
        self.token_embed = nnx.Embed(num_states + 1, width, rngs=rngs)  # + BOS
        self.position_embed = nnx.Embed(length, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, num_states, rngs=rngs)

    def __call__(self, inputs):
        h = self.token_embed(inputs) + self.position_embed(jnp.arange(inputs.shape[-1]))
        mask = nnx.make_causal_mask(inputs)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.norm(h))


def forward(graphdef, params, inputs):
    """The network ``nnx.merge(graphdef, params)`` on ``inputs`` (a pure function)."""
    return nnx.merge(graphdef, params)(inputs)


def sequence_logits(graphdef, params, tokens, num_states):
    """``(B, T, V)``: at index ``t - 1`` the logits of ``x_t`` given ``x_0..x_{t-1}``, along
    ``(B, T + 1)`` tokens: one causal forward over ``[BOS, x_0..x_{T-1}]`` (teacher forcing, as an
    engine scores a sequence)."""
    bos = jnp.full(tokens.shape[:1] + (1,), num_states, tokens.dtype)
    return forward(graphdef, params, jnp.concatenate([bos, tokens[:, :-1]], axis=1))[:, 1:]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TransformerModel:
    """A ``CharTransformer`` as a specjax protocol model that gives logits.

    State: ``(window, n)``, the ``length`` ids ``[BOS, x_0, x_1, ...]`` (BOS-padded) and the
    number ``n`` of tokens seen. ``logits`` evaluates the window and reads position ``n`` (the
    causal mask hides the padding); ``logits_block`` writes ``K`` tokens and reads ``K + 1``
    positions of one forward pass.
    """

    params: nnx.State
    graphdef: nnx.GraphDef = dataclasses.field(metadata=dict(static=True))
    num_states: int = dataclasses.field(metadata=dict(static=True))
    length: int = dataclasses.field(metadata=dict(static=True))

    def init_state(self):
        return jnp.full((self.length,), self.num_states, jnp.int32), jnp.int32(0)

    def update(self, state, token):
        window, n = state
        return window.at[n + 1].set(jnp.asarray(token, jnp.int32), mode="drop"), n + 1

    def logits(self, state):
        window, n = state
        return forward(self.graphdef, self.params, window[None])[0, n]

    def logits_block(self, state, tokens):
        window, n = state
        window = jax.lax.dynamic_update_slice(window, jnp.asarray(tokens, jnp.int32), (n + 1,))
        out = forward(self.graphdef, self.params, window[None])[0]
        return jax.lax.dynamic_slice_in_dim(out, n, tokens.shape[0] + 1)


def protocol_model(graphdef, params, num_states, length) -> TransformerModel:
    return TransformerModel(params, graphdef, num_states, length)


# ---------------------------------------------------------------------------------------------
# Training on the corpus (optax, cross-entropy of the next character).


def corpus(num_states: int, max_bytes: int) -> np.ndarray:
    texts = read_corpus(max_bytes)
    return np.concatenate(encode(texts, character_classes(texts, num_states), num_states))


def train(key, ids, num_states, length, *, width, heads, layers, steps, batch=32, lr=3e-3):
    """A ``CharTransformer`` from a random init, trained ``steps`` Adam steps on windows of
    ``length`` characters of ``ids``. Returns ``(graphdef, params, final loss)``."""
    init_key, data_key = jax.random.split(key)
    net = CharTransformer(num_states, length, width, heads, layers,
                          rngs=nnx.Rngs(int(jax.random.randint(init_key, (), 0, 2**31 - 1))))
    graphdef, params = nnx.split(net)
    optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, steps // 10 + 1, steps))
    opt_state = optimizer.init(params)
    data = jnp.asarray(ids)

    def loss(params, windows):  # windows (N, L): predict each from BOS and those before
        bos = jnp.full(windows.shape[:1] + (1,), num_states, windows.dtype)
        logits = forward(graphdef, params, jnp.concatenate([bos, windows[:, :-1]], axis=1))
        return optax.softmax_cross_entropy_with_integer_labels(logits, windows).mean()

    @jax.jit
    def step(params, opt_state, key):
        starts = jax.random.randint(key, (batch,), 0, data.size - length)
        windows = data[starts[:, None] + jnp.arange(length)]
        value, grads = jax.value_and_grad(loss)(params, windows)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    value = jnp.nan
    for k in jax.random.split(data_key, steps):
        params, opt_state, value = step(params, opt_state, k)
    return graphdef, params, float(value)


# ---------------------------------------------------------------------------------------------
# Exact values where every sequence can be enumerated.


def all_sequences(num_states: int, length: int) -> np.ndarray:
    """``(V**n, n)``: every sequence of ``n`` tokens, in base-``V`` order (first token most
    significant)."""
    return np.array(list(itertools.product(range(num_states), repeat=length)), np.int32) \
        .reshape(-1, length)


def network_rows(graphdef, params, num_states, horizon) -> np.ndarray:
    """``(V**T, T + 1, V)`` float64: along every ``x_0..x_{T-1}``, the network's laws of
    ``x_0..x_T`` (one forward over ``[BOS, x_0..x_{T-1}]``)."""
    seqs = jnp.asarray(all_sequences(num_states, horizon))
    bos = jnp.full((seqs.shape[0], 1), num_states, jnp.int32)
    # One compiled forward per network (op by op, it dispatched a few hundred small programs).
    logits = np.asarray(jax.jit(forward, static_argnums=0)(
        graphdef, params, jnp.concatenate([bos, seqs], axis=1)), np.float64)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(-1, keepdims=True)


def prefix_lift(rows: np.ndarray, num_states: int, horizon: int) -> specjax.FiniteStateModel:
    """The network as a ``FiniteStateModel`` on the prefix tree: a state per prefix
    ``x_0..x_{d-1}`` (``d = 0..T + 1``), its row the law of ``x_d`` (``rows`` from
    ``network_rows``); the prefixes of length ``T + 1`` are never read (uniform rows, loops)."""
    v, t = num_states, horizon
    sizes = [v ** d for d in range(t + 2)]
    offsets = np.cumsum([0] + sizes)
    table = np.full((offsets[-1], v), 1.0 / v)
    next_state = np.empty((offsets[-1], v), np.int64)
    for d in range(t + 1):
        prefixes = np.arange(sizes[d])
        table[offsets[d]:offsets[d + 1]] = rows[prefixes * v ** (t - d), d]
        next_state[offsets[d]:offsets[d + 1]] = offsets[d + 1] + prefixes[:, None] * v \
            + np.arange(v)
    last = np.arange(offsets[t + 1], offsets[t + 2])
    next_state[last] = last[:, None]
    return specjax.FiniteStateModel(start=0, next_state=jnp.asarray(next_state, jnp.int32),
                                    table=jnp.asarray(table))


def enumerated_recording(draft_rows, target_rows, num_states, horizon, decoders):
    """Every sequence ``x_0..x_T`` with both networks' rows, weighted by its target
    probability: ``Recording.from_arrays``'s estimates are then exact."""
    tokens = all_sequences(num_states, horizon + 1)
    prefix = tokens[:, :-1] @ (num_states ** np.arange(horizon - 1, -1, -1))
    p, q = draft_rows[prefix, 1:], target_rows[prefix, 1:]  # laws of x_1..x_T
    emitted = np.take_along_axis(q, tokens[:, 1:, None], axis=-1)[..., 0]  # q_t(x_t)
    weights = target_rows[prefix, 0, tokens[:, 0]] * np.prod(emitted, axis=1)
    return specjax.Recording.from_arrays(tokens, p, q, weights=weights, decoders=decoders)


def exact_values(decoders, draft_rows, target_rows, num_states, horizon, cost):
    """``{label: (calls, rejections, time)}`` of ``specjax.exact`` on the prefix-tree lifts."""
    draft, target = (prefix_lift(r, num_states, horizon) for r in (draft_rows, target_rows))
    out = {}
    for decoder in decoders:
        exact = specjax.exact(decoder, draft, target, horizon=horizon)
        timed = specjax.expected_time(decoder, draft, target, cost, horizon=horizon)
        out[label(decoder)] = (float(exact.expected_calls), float(exact.expected_rejections),
                              float(timed))
    return out


# ---------------------------------------------------------------------------------------------
# The run.


def label(decoder) -> str:
    """The decoder's label, ``SD (K = T)`` for SD drafting to the horizon."""
    return "SD (K = T)" if decoder == specjax.Speculative() else decoder.label


def estimates(decoders, recording, cost):
    """``{label: Estimate}``."""
    return {label(d): specjax.estimate(d, recording, cost=cost) for d in decoders}


def dump_and_load(path, tokens, draft, target, num_states, decoders):
    """An engine user's path: both networks score the recorded sequences (one batched forward
    each), the rows go to ``path`` with ``np.savez`` and come back with ``np.load`` into
    ``Recording.from_arrays``."""
    tokens = jnp.asarray(tokens)
    score = jax.jit(sequence_logits, static_argnums=(0, 3))
    rows = [np.asarray(jax.nn.softmax(score(m.graphdef, m.params, tokens, num_states), -1))
            for m in (draft, target)]
    np.savez(path, tokens=np.asarray(tokens), draft_probs=rows[0], target_probs=rows[1])
    with np.load(path) as data:
        return specjax.Recording.from_arrays(data["tokens"], data["draft_probs"],
                                             data["target_probs"], decoders=decoders)


def distill(key, draft, target, num_states, *, lookahead, cost, sequences, horizon, steps,
            lr, decoders=()):
    """The draft's parameters after ``steps`` Adam steps on SD(``lookahead``)'s expected time
    over ``sequences`` target rollouts (key ``key``), from the trained draft. Returns
    ``(params, first value, last value)``."""
    # The same size and decoders as the evaluation's recording: the compiled programs are shared.
    train_rec = specjax.record(key, draft, target, sequences, horizon=horizon, decoders=decoders)
    graphdef = draft.graphdef

    def apply(params, tokens):
        return sequence_logits(graphdef, params, tokens, num_states)

    loss = decoding_objective(specjax.Speculative(lookahead=lookahead), apply, "time",
                              cost=cost, logits=True)
    optimizer = optax.adam(optax.cosine_decay_schedule(lr, steps))

    @jax.jit
    def step(params, state):
        value, grad = jax.value_and_grad(lambda p: loss(p, train_rec).value)(params)
        updates, state = optimizer.update(grad, state, params)
        return optax.apply_updates(params, updates), state, value

    params, state = draft.params, optimizer.init(draft.params)
    values = []
    for _ in range(steps):
        params, state, value = step(params, state)
        values.append(float(value))
    return params, values[0], float(loss(params, train_rec).value)


def fmt(value, se):
    return f"{float(value):.3f} ± {float(se):.3f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="V = 8, T = 3, small networks and runs (with exact values)")
    parser.add_argument("--states", type=int, help="V: character classes (default 16)")
    parser.add_argument("--horizon", type=int, help="T (default 32)")
    parser.add_argument("--steps", type=int, help="training steps per network (default 300)")
    parser.add_argument("--sequences", type=int, help="recorded rollouts (default 1,000)")
    parser.add_argument("--distill-sequences", type=int,
                        help="distillation rollouts (default: --sequences)")
    parser.add_argument("--distill-steps", type=int, help="distillation steps (default 150)")
    parser.add_argument("--max-lookahead", type=int, help="best_lookahead's range (default 8)")
    parser.add_argument("--draft-cost", type=float, default=0.1,
                        help="CostModel's draft cost (target cost 1)")
    parser.add_argument("--max-bytes", type=int, default=200_000, help="corpus characters")
    parser.add_argument("--x64", action="store_true", help="float64 (exact checks to 1e-10)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    small = dict(states=8, horizon=3, steps=40, sequences=400, distill_steps=10,
                 max_lookahead=3, lookaheads=(1,))
    full = dict(states=16, horizon=32, steps=300, sequences=1000, distill_steps=150,
                max_lookahead=8, lookaheads=(1, 2, 4, 8))
    for name, value in (small if args.tiny else full).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.distill_sequences = args.distill_sequences or args.sequences
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    v, t = args.states, args.horizon
    length = t + 1  # BOS, x_0..x_{T-1}: the laws of x_0..x_T
    target_size = dict(width=32, heads=4, layers=2) if args.tiny else \
        dict(width=64, heads=4, layers=2)
    draft_size = dict(width=16, heads=2, layers=1) if args.tiny else \
        dict(width=32, heads=2, layers=1)
    cost = specjax.CostModel(args.draft_cost, 1.0)
    keys = jax.random.split(jax.random.key(args.seed), 6)
    timings = {}
    clock = time.perf_counter()

    ids = corpus(v, args.max_bytes)
    split = int(0.9 * ids.size)
    models, losses = {}, {}
    for name, size, key in (("target", target_size, keys[0]), ("draft", draft_size, keys[1])):
        graphdef, params, loss = train(key, ids[:split], v, length, steps=args.steps, **size)
        models[name] = protocol_model(graphdef, params, v, length)
        losses[name] = loss
    draft, target = models["draft"], models["target"]
    timings["train"] = time.perf_counter() - clock
    count = {n: sum(x.size for x in jax.tree.leaves(m.params)) for n, m in models.items()}
    print(f"V = {v}, T = {t}; corpus {ids.size:,} characters; {args.steps} AdamW steps each")
    for name in ("target", "draft"):
        print(f"  {name}: {count[name]:,} parameters, training loss {losses[name]:.3f} nats")

    batch = specjax.BatchSpeculative(4, lookahead=4)
    sd = [specjax.Speculative(lookahead=k) for k in args.lookaheads]
    clock = time.perf_counter()
    rec = specjax.record(keys[2], draft, target, args.sequences, horizon=t, decoders=(batch,))
    timings["record"] = time.perf_counter() - clock
    choice = specjax.pairs.best_lookahead(rec, cost, max_lookahead=args.max_lookahead)
    k_best = max(1, int(choice.lookahead))
    chosen = specjax.Speculative(lookahead=k_best)
    decoders = sorted(set(sd + [chosen]), key=lambda d: d.lookahead) \
        + [specjax.Speculative(), batch]
    before = estimates(decoders, rec, cost)

    clock = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        dumped = dump_and_load(pathlib.Path(tmp) / "dump.npz", rec.tokens, draft, target, v,
                               (batch,))
    from_arrays = estimates(decoders, dumped, cost)
    timings["dump"] = time.perf_counter() - clock

    clock = time.perf_counter()
    params, start_value, end_value = distill(
        keys[3], draft, target, v, lookahead=k_best, cost=cost, sequences=args.distill_sequences,
        horizon=t, steps=args.distill_steps, lr=3e-3, decoders=(batch,))
    distilled = dataclasses.replace(draft, params=params)
    timings["distill"] = time.perf_counter() - clock
    rec_after = specjax.record(keys[2], distilled, target, args.sequences, horizon=t,
                               decoders=(batch,))
    same_tokens = bool((np.asarray(rec_after.tokens) == np.asarray(rec.tokens)).all())
    after = estimates(decoders, rec_after, cost)
    choice_after = specjax.pairs.best_lookahead(rec_after, cost, max_lookahead=args.max_lookahead)

    exact = {}
    if v ** (t + 1) <= MAX_ENUMERATED:
        clock = time.perf_counter()
        target_rows = network_rows(target.graphdef, target.params, v, t)
        for name, params_ in (("before", draft.params), ("after", params)):
            draft_rows = network_rows(draft.graphdef, params_, v, t)
            values = exact_values(decoders, draft_rows, target_rows, v, t, cost)
            enumerated = estimates(decoders, enumerated_recording(
                draft_rows, target_rows, v, t, (batch,)), cost)
            gap = max(abs(float(getattr(enumerated[label(d)], f)) - values[label(d)][i])
                      for d in decoders for i, f in enumerate(
                          ("expected_calls", "expected_rejections", "expected_time")))
            exact[name] = values, gap
        timings["exact"] = time.perf_counter() - clock

    # The table.
    print(f"\n{args.sequences:,} recorded target rollouts; CostModel(draft {args.draft_cost}, "
          f"target 1); distilled for SD(K = {k_best})'s expected time on "
          f"{args.distill_sequences:,} other rollouts, {args.distill_steps} Adam steps "
          f"(objective {start_value:.3f} -> {end_value:.3f})\n")
    head = "| decoder | draft | calls | rejections | time | speed-up |"
    if exact:
        head += " exact calls | exact time |"
    print(head)
    print("| --- | --- |" + " ---: |" * (head.count("|") - 3))
    rows = []
    for name, table, tag in [(label(d), before, "trained") for d in decoders] \
            + [(label(d), after, "distilled") for d in decoders]:
        est = table[name]
        line = (f"| {name} | {tag} | {fmt(est.expected_calls, est.expected_calls_se)} | "
                f"{fmt(est.expected_rejections, est.expected_rejections_se)} | "
                f"{fmt(est.expected_time, est.expected_time_se)} | "
                f"{fmt(est.speedup, est.speedup_se)} |")
        row = dict(decoder=name, draft=tag, **{
            f: float(getattr(est, f)) for f in (
                "expected_calls", "expected_calls_se", "expected_rejections",
                "expected_rejections_se", "expected_time", "expected_time_se", "speedup",
                "speedup_se")})
        if exact:
            calls, rejections, timed = exact["before" if tag == "trained" else "after"][0][name]
            line += f" {calls:.3f} | {timed:.3f} |"
            row.update(exact_calls=calls, exact_rejections=rejections, exact_time=timed)
        print(line)
        rows.append(row)
    print(f"\nbest K (best_lookahead, K <= {args.max_lookahead}): trained draft "
          f"{int(choice.lookahead)}, distilled draft {int(choice_after.lookahead)}")
    diff = max(abs(float(getattr(before[label(d)], f)) - float(getattr(from_arrays[label(d)], f)))
               for d in decoders for f in ("expected_calls", "expected_rejections",
                                           "expected_time", "expected_calls_se"))
    print(f"from_arrays (np.savez dump, loaded back) vs direct record: largest difference "
          f"{diff:.2e}")
    print(f"re-recording with the distilled draft gave the same target rollouts: {same_tokens}")
    for name, (_, gap) in exact.items():
        print(f"exact ({name} distillation): enumerated from_arrays estimate vs specjax.exact "
              f"on the prefix-tree lift: largest difference {gap:.2e}")
    print("seconds: " + ", ".join(f"{k} {s:.1f}" for k, s in timings.items()))
    return dict(rows=rows, lookahead=int(choice.lookahead),
                lookahead_after=int(choice_after.lookahead), from_arrays_diff=diff,
                same_tokens=same_tokens, exact_gaps={k: g for k, (_, g) in exact.items()},
                objective=(start_value, end_value))


if __name__ == "__main__":
    main()
