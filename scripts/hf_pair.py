"""HuggingFace end to end: dump a transformers draft/target pair, estimate SD, check HF's own SD.

Two small causal LMs built from configs, randomly initialised (no download): a ``GPT2LMHeadModel``
target and a draft that is its first layer (the target's embeddings, first block and final norm,
copied: a LayerSkip-style draft sharing the vocabulary). Then, as a user of "HuggingFace, vLLM
and SGLang dumps" would (notation: ``p`` the draft, ``q`` the target, as in specjax; HF names
them the other way round):

1. sample target rollouts with ``target.generate(do_sample=True, output_scores=True,
   output_logits=True, return_dict_in_generate=True)`` from a few prompts, with the sampling
   settings written out (``top_k=0``: HF's default is ``top_k=50``); ``scores`` are the logits
   after the logits processors (what was sampled from), ``logits`` the raw ones: at ``top_k=0``,
   ``temperature=1`` they coincide (the script prints the largest difference);
2. score the draft along the target's tokens with one forward pass over the full sequences (the
   logits at position ``t - 1`` give the law of token ``t``), and the target likewise, to check
   ``generate``'s scores against a teacher-forced pass;
3. dump with NumPy in specjax's ``.npz`` layout (``specjax.pairs.recording``): ``tokens``
   ``x_0..x_T`` (``x_0`` the last prompt token), ``draft_prob``, ``target_prob`` and ``lengths``
   (sequences that stopped at EOS); load it (``specjax.Recording.load``), and build the same
   recording from the full rows as log-probabilities (``from_arrays(..., logits=True)``);
4. estimate SD at every ``K`` (``specjax.estimate``, with standard errors, under a ``CostModel``
   whose draft cost is the draft's share of the target's layers) and choose ``K``
   (``specjax.pairs.best_lookahead``);
5. run HF's own assisted generation with sampling (``assistant_model=draft, do_sample=True``) many
   times from one prompt on a tiny pair (``V = 8``, ``T = 3``), and test its output law against
   the target's exact law over the ``V**T`` continuations (enumerated with the torch model) with
   ``specjax.auditing.sequence_fit``; its mean number of target calls against SD's exact expected
   calls (``specjax.estimate`` on every continuation weighted by its target probability).

In transformers 5.x the draft length of assisted generation is read off the *assistant's*
``generation_config`` (``num_assistant_tokens``, default 20), and the assistant stops drafting
early when its own probability of a drafted token is below ``assistant_confidence_threshold``
(default 0.4): ``num_assistant_tokens=K`` passed to ``target.generate`` is not what sets ``K``. The
script sets both on the assistant (``K``, threshold 0, schedule ``"constant"``) and counts the
target's forward passes to confirm the calls.

Needs torch and transformers (``pip install -e '.[hf]'``); the library itself imports neither.

    python scripts/hf_pair.py                          # V = 64, T = 32, 400 rollouts; ~1 min
    python scripts/hf_pair.py --quick                  # the test's run, a few seconds
    python scripts/hf_pair.py --figure docs/hf_speedup_vs_k.png
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import tempfile
import time

import numpy as np
import torch
import transformers
from transformers import GenerationConfig
from transformers import GPT2Config
from transformers import GPT2LMHeadModel

import specjax
from specjax.auditing.history import SequenceLaw
from specjax.auditing.history import sequence_fit


@dataclasses.dataclass(frozen=True)
class Settings:
    """The sizes of a run (``DEFAULT``, ``QUICK``)."""

    vocab: int = 64            # V of the estimation pair (its last id is EOS)
    layers: int = 4            # target layers (the draft has one)
    width: int = 64            # n_embd
    init: float = 0.1          # initializer_range: 0.02 (GPT-2's) gives near-uniform rows
    prompts: int = 4           # prompts of random tokens
    prompt_length: int = 4
    rollouts: int = 400        # target rollouts in all (spread over the prompts)
    horizon: int = 32          # T: new tokens per rollout
    max_lookahead: int = 8
    fit_vocab: int = 8         # the assisted-generation check: V**T continuations enumerated
    fit_horizon: int = 3
    fit_runs: int = 3000       # assisted generate calls
    fit_lookahead: int = 2
    seed: int = 0


DEFAULT = Settings()
QUICK = Settings(rollouts=64, horizon=12, max_lookahead=4, fit_runs=400)


def build_pair(vocab: int, layers: int, width: int, init: float, *, positions: int,
               eos: int | None, seed: int):
    """``(draft, target)``: a ``GPT2LMHeadModel`` target of ``layers`` blocks, randomly
    initialised under ``torch.manual_seed(seed)``, and a one-block draft holding the target's
    embeddings, first block and final norm (same vocabulary, same tokens)."""
    torch.manual_seed(seed)
    config = dict(n_head=2, n_embd=width, vocab_size=vocab, n_positions=positions,
                  initializer_range=init, bos_token_id=None, eos_token_id=eos,
                  pad_token_id=0 if eos is None else eos)
    target = GPT2LMHeadModel(GPT2Config(n_layer=layers, **config)).eval()
    draft = GPT2LMHeadModel(GPT2Config(n_layer=1, **config)).eval()
    # The target's other blocks are the unexpected keys; every draft weight is the target's.
    missing = draft.load_state_dict(target.state_dict(), strict=False).missing_keys
    assert not missing, missing
    return draft, target


def sampling_config(max_new_tokens: int, eos: int | None, pad: int, **extra) -> GenerationConfig:
    """Pure sampling from the model's softmax, every setting written out (HF's defaults would
    add ``top_k=50``), exactly ``max_new_tokens`` tokens unless ``eos`` comes first."""
    return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=None,
                            typical_p=1.0, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                            eos_token_id=eos, pad_token_id=pad, **extra)


def log_rows(model, sequences: torch.Tensor, prompt_length: int, horizon: int) -> np.ndarray:
    """``(B, T, V)`` float64 log-probabilities of ``model`` along ``sequences`` (``(B, P + T)``
    prompt and new tokens), from one causal forward pass: index ``t - 1`` holds the law of
    ``x_t`` (the logits at position ``P - 1 + t - 1`` of the sequence)."""
    with torch.no_grad():
        logits = model(input_ids=sequences).logits
    rows = logits[:, prompt_length - 1:prompt_length - 1 + horizon].double()
    return torch.log_softmax(rows, dim=-1).numpy()


def gather(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``(B, T)``: ``rows[b, t - 1, x_t]`` for ``tokens`` ``x_0..x_T``."""
    return np.take_along_axis(rows, tokens[:, 1:, None], axis=-1)[..., 0]


def eos_lengths(new_tokens: np.ndarray, eos: int) -> np.ndarray:
    """``(B,)``: tokens emitted up to and including the first ``eos`` (``T`` without one)."""
    hit = new_tokens == eos
    return np.where(hit.any(1), hit.argmax(1) + 1, new_tokens.shape[1])


def record_rollouts(draft, target, s: Settings, path) -> dict:
    """Steps 1 to 3 of the module docstring: rollouts, scores, the ``.npz`` dump. Returns the
    arrays and the consistency checks."""
    eos = s.vocab - 1
    torch.manual_seed(s.seed + 1)
    prompts = torch.randint(0, eos, (s.prompts, s.prompt_length))  # no EOS in a prompt
    per_prompt = -(-s.rollouts // s.prompts)
    inputs = prompts.repeat_interleave(per_prompt, 0)[:s.rollouts]
    config = sampling_config(s.horizon, eos, eos, output_scores=True, output_logits=True,
                             return_dict_in_generate=True)
    with torch.no_grad():
        out = target.generate(inputs, attention_mask=torch.ones_like(inputs),
                              generation_config=config)
    sequences = out.sequences  # (B, P + T'): T' < T when every rollout stopped early
    if sequences.shape[1] < s.prompt_length + s.horizon:  # pad to T as HF pads finished rows
        pad = torch.full((sequences.shape[0], s.prompt_length + s.horizon - sequences.shape[1]),
                         eos, dtype=sequences.dtype)
        sequences = torch.cat([sequences, pad], 1)
    tokens = sequences[:, s.prompt_length - 1:].numpy().astype(np.int32)  # (B, T + 1)
    lengths = eos_lengths(tokens[:, 1:], eos)
    live = np.arange(s.horizon)[None] < lengths[:, None]
    steps = len(out.scores)
    scores = torch.stack(out.scores, 1).double()  # processed: the law sampled from
    raw = torch.stack(out.logits, 1).double()
    processed_vs_raw = float((scores - raw).abs().max())
    target_rows = np.full((s.rollouts, s.horizon, s.vocab), -np.log(s.vocab))  # padding
    target_rows[:, :steps] = torch.log_softmax(scores, -1).numpy()
    forward_rows = log_rows(target, sequences, s.prompt_length, s.horizon)
    generate_vs_forward = float(np.abs(target_rows - forward_rows)[live].max())
    draft_rows = log_rows(draft, sequences, s.prompt_length, s.horizon)
    draft_prob, target_prob = np.exp(gather(draft_rows, tokens)), np.exp(gather(target_rows,
                                                                                 tokens))
    np.savez(path, tokens=tokens, draft_prob=draft_prob, target_prob=target_prob, lengths=lengths)
    return dict(tokens=tokens, lengths=lengths, draft_rows=draft_rows, target_rows=target_rows,
                processed_vs_raw=processed_vs_raw, generate_vs_forward=generate_vs_forward)


def estimates(rec, cost, max_lookahead: int) -> list[dict]:
    """SD at ``K = 1..max_lookahead`` from ``rec``: each quantity with its standard error."""
    rows = []
    for k in range(1, max_lookahead + 1):
        est = specjax.estimate(specjax.Speculative(lookahead=k), rec, cost=cost)
        names = ("expected_rejections", "expected_calls", "expected_time", "speedup",
                 "accepted_length")
        rows.append(dict(k=k, **{n: (float(getattr(est, n)), float(getattr(est, n + "_se")))
                                 for n in names}))
    return rows


def all_continuations(vocab: int, horizon: int) -> np.ndarray:
    """``(V**T, T)`` every continuation, in lexicographic order."""
    return np.array(list(itertools.product(range(vocab), repeat=horizon)), np.int64)


def exact_law(draft, target, prompt: torch.Tensor, horizon: int):
    """The target's exact law over ``x_0..x_T`` (``x_0`` the prompt's last token) as a
    ``SequenceLaw`` over all ``V**(T + 1)`` sequences, enumerated with the torch model (one
    forward over the ``V**T`` continuations), and the continuations' draft and target log-rows
    (for SD's exact costs)."""
    vocab = target.config.vocab_size
    tails = all_continuations(vocab, horizon)
    sequences = torch.cat([prompt.repeat(len(tails), 1), torch.from_numpy(tails)], 1)
    length = prompt.shape[1]
    target_rows = log_rows(target, sequences, length, horizon)
    draft_rows = log_rows(draft, sequences, length, horizon)
    tokens = sequences[:, length - 1:].numpy()
    tail_probs = np.exp(gather(target_rows, tokens).sum(1))  # (V**T,)
    x0 = int(prompt[0, -1])
    probs = np.zeros(vocab ** (horizon + 1))
    probs[x0 * vocab ** horizon:(x0 + 1) * vocab ** horizon] = tail_probs  # lexicographic order
    sequences_all = np.array(list(itertools.product(range(vocab), repeat=horizon + 1)), np.int64)
    return SequenceLaw(sequences_all, probs), tokens, draft_rows, target_rows, tail_probs


def assisted_runs(draft, target, prompt: torch.Tensor, horizon: int, lookahead: int, runs: int,
                  **extra):
    """``runs`` calls of HF's assisted generation with sampling from ``prompt``: ``(tokens (N,
    T + 1), target calls (N,))``, the calls counted as the target's forward passes. ``extra``:
    more generation settings (``assistant_ensemble_weight=w``: HF's lossy verification)."""
    assistant = draft.generation_config
    # transformers 5.x reads K off the assistant's config (module docstring): constant K, no
    # early stop on the draft's confidence. num_assistant_tokens on generate's config as well.
    assistant.num_assistant_tokens = lookahead
    assistant.num_assistant_tokens_schedule = "constant"
    assistant.assistant_confidence_threshold = 0.0
    config = sampling_config(horizon, None, 0, num_assistant_tokens=lookahead,
                             num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.0, **extra)
    calls = [0]
    handle = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    tokens, counts = [], []
    try:
        with torch.no_grad():
            for _ in range(runs):
                calls[0] = 0
                out = target.generate(prompt, attention_mask=torch.ones_like(prompt),
                                      assistant_model=draft, generation_config=config)
                tokens.append(out[0, prompt.shape[1] - 1:].numpy())
                counts.append(calls[0])
    finally:
        handle.remove()
    return np.stack(tokens), np.array(counts)


def plain_samples(model, prompt: torch.Tensor, horizon: int, runs: int) -> np.ndarray:
    """``(N, T + 1)``: ``runs`` plain sampled continuations of ``model`` (one batched call)."""
    inputs = prompt.repeat(runs, 1)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs),
                             generation_config=sampling_config(horizon, None, 0))
    return out[:, prompt.shape[1] - 1:].numpy()


def check_assisted(s: Settings) -> dict:
    """Step 5 of the module docstring: HF's assisted generation against the exact law."""
    draft, target = build_pair(s.fit_vocab, s.layers, s.width, s.init, positions=16, eos=None,
                               seed=s.seed + 2)
    torch.manual_seed(s.seed + 3)
    prompt = torch.randint(0, s.fit_vocab, (1, s.prompt_length))
    law, tokens, draft_rows, target_rows, weights = exact_law(draft, target, prompt,
                                                               s.fit_horizon)
    draft_law = exact_law(target, draft, prompt, s.fit_horizon)[0]  # roles swapped: draft's law
    # SD's exact expected calls on this pair: every continuation, weighted by its probability.
    every = specjax.Recording.from_arrays(tokens, draft_rows, target_rows, logits=True,
                                          weights=weights)
    exact = specjax.estimate(specjax.Speculative(lookahead=s.fit_lookahead), every)
    torch.manual_seed(s.seed + 4)
    start = time.perf_counter()
    samples, calls = assisted_runs(draft, target, prompt, s.fit_horizon, s.fit_lookahead,
                                   s.fit_runs)
    seconds = time.perf_counter() - start
    lossy = None
    if hasattr(GenerationConfig(), "assistant_ensemble_weight"):  # transformers >= 5.2x
        torch.manual_seed(s.seed + 6)
        lossy = sequence_fit(assisted_runs(draft, target, prompt, s.fit_horizon, s.fit_lookahead,
                                           s.fit_runs, assistant_ensemble_weight=0.3)[0], law)
    torch.manual_seed(s.seed + 5)
    return dict(
        assisted=sequence_fit(samples, law), lossy=lossy,
        target=sequence_fit(plain_samples(target, prompt, s.fit_horizon, s.fit_runs), law),
        draft=sequence_fit(plain_samples(draft, prompt, s.fit_horizon, s.fit_runs), law),
        tv_draft_target=draft_law.total_variation(law),
        calls=(float(calls.mean()), float(calls.std(ddof=1) / np.sqrt(len(calls)))),
        exact_calls=float(exact.expected_calls), seconds=seconds)


def plot(rows, path) -> None:
    """Speed-up against ``K`` with 2-standard-error bars (``K = 0``: autoregressive, 1)."""
    import matplotlib  # noqa: PLC0415 - only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ks = [0] + [r["k"] for r in rows]
    speedup = [1.0] + [r["speedup"][0] for r in rows]
    se = [0.0] + [r["speedup"][1] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.errorbar(ks, speedup, yerr=2 * np.array(se), fmt="o-", capsize=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("lookahead K (K = 0: autoregressive)")
    ax.set_ylabel("estimated speed-up (± 2 se)")
    ax.set_title("SD on a GPT-2 pair (transformers), from target rollouts", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (the test's run)")
    parser.add_argument("--rollouts", type=int, help="target rollouts (default 400)")
    parser.add_argument("--horizon", type=int, help="T, new tokens per rollout (default 32)")
    parser.add_argument("--fit-runs", type=int, help="assisted generate calls (default 3000)")
    parser.add_argument("--out", help="folder for the .npz dump (default: a temporary one)")
    parser.add_argument("--figure", help="write speed-up against K to this PNG")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else DEFAULT
    s = dataclasses.replace(s, **{k: v for k, v in (("rollouts", args.rollouts),
                                                    ("horizon", args.horizon),
                                                    ("fit_runs", args.fit_runs)) if v})
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)  # tiny models: threads only contend
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    draft, target = build_pair(s.vocab, s.layers, s.width, s.init,
                               positions=s.prompt_length + s.horizon, eos=s.vocab - 1,
                               seed=s.seed)
    cost = specjax.CostModel(draft_cost=1 / s.layers, target_cost=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(args.out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "hf_pair.npz"
        start = time.perf_counter()
        dump = record_rollouts(draft, target, s, path)
        rec = specjax.Recording.load(path)
        stopped = int((dump["lengths"] < s.horizon).sum())
        print(f"V = {s.vocab}, T = {s.horizon}: {s.rollouts} target rollouts from {s.prompts} "
              f"prompts in {time.perf_counter() - start:.1f} s, {stopped} stopped at EOS (id "
              f"{s.vocab - 1}); dumped to {path.name}")
        print(f"  output_scores vs output_logits (top_k=0, temperature=1): max |diff| "
              f"{dump['processed_vs_raw']:.2g}")
        print(f"  generate's target log-probs vs one forward pass: max |diff| "
              f"{dump['generate_vs_forward']:.2g}")
        rows_rec = specjax.Recording.from_arrays(dump["tokens"], dump["draft_rows"],
                                                 dump["target_rows"], logits=True,
                                                 lengths=dump["lengths"])
        rows = estimates(rec, cost, s.max_lookahead)
        from_rows = estimates(rows_rec, cost, s.max_lookahead)
        gap = max(abs(a[n][0] - b[n][0]) for a, b in zip(rows, from_rows)
                  for n in ("expected_calls", "expected_time"))
        print(f"  the .npz statistics vs the log-prob rows (from_arrays, logits=True): largest "
              f"difference {gap:.2g}")
        choice = specjax.pairs.best_lookahead(rec, cost, max_lookahead=s.max_lookahead)
        arrays = {name: value for name, value in np.load(path).items()}

    print(f"\nSD from the dump, draft cost {cost.draft_cost:.2f} (1 of {s.layers} layers), "
          f"target 1; mean ± standard error over the rollouts")
    print("| K | E[calls] | E[rejections] | accepted/call | E[time] | speed-up |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [f"{r[n][0]:.2f} ± {r[n][1]:.2f}" for n in
                 ("expected_calls", "expected_rejections", "accepted_length", "expected_time")]
        print(f"| {r['k']} | " + " | ".join(cells)
              + f" | {r['speedup'][0]:.3f} ± {r['speedup'][1]:.3f} |")
    print(f"best K {choice.lookahead} (time {choice.expected_time:.2f} ± "
          f"{choice.times_se[choice.lookahead]:.2f}), runner-up {choice.runner_up}, slower by "
          f"{choice.difference:.3f} ± {choice.difference_se:.3f}")
    if args.figure:
        plot(rows, args.figure)
        print(f"figure: {args.figure}")

    fit = check_assisted(s)
    a = fit["assisted"]
    print(f"\nHF assisted generation (transformers {transformers.__version__}), do_sample=True, "
          f"K = {s.fit_lookahead}, V = {s.fit_vocab}, T = {s.fit_horizon}: {a.num_sequences} "
          f"runs from one prompt in {fit['seconds']:.1f} s")
    print(f"  against the target's exact law over {s.fit_vocab}**{s.fit_horizon} continuations: "
          f"p-value {a.pvalue:.3f}, impossible {a.impossible}, flagged {a.flagged}")
    print(f"  target's own sampling: p-value {fit['target'].pvalue:.3f}; the draft's own "
          f"(TV {fit['tv_draft_target']:.3f} from the target): p-value {fit['draft'].pvalue:.2g}, "
          f"flagged {fit['draft'].flagged}")
    if fit["lossy"] is not None:
        print(f"  HF's lossy ensemble verification (assistant_ensemble_weight=0.3): p-value "
              f"{fit['lossy'].pvalue:.2g}, flagged {fit['lossy'].flagged}")
    print(f"  target calls per run {fit['calls'][0]:.3f} ± {fit['calls'][1]:.3f}; SD's exact "
          f"E[calls] {fit['exact_calls']:.3f}")
    return dict(settings=s, cost=cost, rows=rows, from_rows=from_rows, choice=choice,
                arrays=arrays, dump=dump, fit=fit)


if __name__ == "__main__":
    main()
