"""Independent NumPy references for the engine-facing functions, written from the published
algorithms and the engines' documented semantics, not from specjax's code:

* ``literal_verify``: Leviathan et al. (2023), Algorithm 1, as an engine's per-request loop
  over given drafts, with given random numbers (the convention of ``specjax.verify_drafts``), and
  the classic bugs engines shipped as options;
* ``literal_law``: the exact law of that loop's output, in closed form;
* ``literal_process``: temperature, top-k, top-p and min-p in vLLM's or HuggingFace's order, one
  row at a time with Python sorting.
"""

from __future__ import annotations

import numpy as np

BUGS = ("accept_all", "wrong_residual", "zero_uniform", "softmax_greedy")


def inverse_cdf(v: float, w: np.ndarray) -> int:
    """The smallest ``y`` with ``v * sum(w) < cumsum(w)[y]`` (the last positive one at worst)."""
    cw = np.cumsum(w)
    hits = np.flatnonzero(v * cw[-1] < cw)
    last = int(np.flatnonzero(w > 0)[-1])
    return min(int(hits[0]), last) if hits.size else last


def literal_verify(x, p, q, k, u, v, bug=None, greedy=False):
    """One request: drafts ``x[:k]``, draft rows ``p`` (``(K, V)``; for ``greedy`` the rows the
    engine *has*, which a correct engine ignores), target rows ``q`` (``(K + 1, V)``), accept
    uniforms ``u`` and sample uniforms ``v``. Returns the padded tokens ``(K + 1,)``."""
    out = [-1] * (len(x) + 1)
    for j in range(k):
        tok = int(x[j])
        if greedy and bug != "softmax_greedy":
            pj = np.eye(q.shape[1])[tok]  # the draft was deterministic: its law is a point mass
        else:
            pj = p[j]
        if bug == "accept_all":
            accept = True
        elif bug == "zero_uniform":  # ratio >= u: at u = 0 a zero-probability token passes
            accept = pj[tok] > 0 and q[j, tok] / pj[tok] >= u[j]
        else:
            accept = pj[tok] > 0 and u[j] < q[j, tok] / pj[tok]
        if accept:
            out[j] = tok
            continue
        w = q[j] if bug == "wrong_residual" else np.maximum(q[j] - pj, 0)
        if w.sum() <= 0:
            w = q[j]
        out[j] = inverse_cdf(v[j], w)
        return np.array(out)
    out[k] = inverse_cdf(v[k], q[k])
    return np.array(out)


def end_output(out, k, stop_tokens=(), bonus=True):
    """An engine's endings applied to one padded output (``literal_verify``'s): without the
    bonus, an output that kept all ``k >= 1`` drafts loses its last token; then everything after
    the first stop token is dropped."""
    out = [int(t) for t in out]
    length = out.index(-1) if -1 in out else len(out)
    if not bonus and k >= 1 and length == k + 1:
        length = k
    for i in range(length):
        if out[i] in stop_tokens:
            length = i + 1
            break
    return np.array(out[:length] + [-1] * (len(out) - length))


def literal_law(x, p, q, k, greedy=False, accept=None, residual=None):
    """``P(n accepted, last token y)`` (``(K + 1, V)``) of ``literal_verify`` without bugs, in
    closed form: accept ``min(1, q(x) / p(x))`` (0 where ``p(x) = 0``), then ``[q - p]_+``.
    ``accept(p_row, q_row, tok)`` and ``residual(p_row, q_row)`` replace the rule's two parts
    (Algorithm 2 of the paper)."""
    num_tokens = q.shape[1]
    law = np.zeros((len(x) + 1, num_tokens))
    reach = 1.0
    for j in range(k):
        tok = int(x[j])
        pj = np.eye(num_tokens)[tok] if greedy else p[j]
        if pj[tok] == 0:  # a draft its own law could not produce: rejected, whatever the rule
            b = 0.0
        elif accept is None:
            b = min(1.0, q[j, tok] / pj[tok])
        else:
            b = accept(pj, q[j], tok)
        w = np.maximum(q[j] - pj, 0) if residual is None else residual(pj, q[j])
        w = w if w.sum() > 0 else q[j]
        law[j] = reach * (1 - b) * w / w.sum()
        reach *= b
    law[k] = reach * q[k]
    return law


def _softmax(z):
    z = np.asarray(z, np.float64)
    m = z[np.isfinite(z)].max()
    e = np.where(np.isfinite(z), np.exp(z - m), 0.0)
    return e / e.sum()


def literal_process(logits, temperature=1.0, top_k=None, top_p=None, min_p=None, order="vllm"):
    """One row of logits through the engines' processing (see ``specjax.process_logits``)."""
    z = np.asarray(logits, np.float64).copy()
    if temperature < 1e-5:  # vLLM's _SAMPLING_EPS: greedy
        out = np.zeros(len(z))
        out[int(np.argmax(z))] = 1.0
        return out
    z = z / temperature

    def top_k_step(z):
        kth = sorted(z, reverse=True)[min(top_k, len(z)) - 1]
        return np.where(z < kth, -np.inf, z)

    def top_p_step(z):
        probs = _softmax(z)
        ranked = sorted(range(len(z)), key=lambda i: (probs[i], i))  # ascending, ties by id
        total, drop = 0.0, np.zeros(len(z), bool)
        for i in ranked[:-1]:
            total += probs[i]
            if total <= 1 - top_p:
                drop[i] = True
        return np.where(drop, -np.inf, z)

    def min_p_step(z):
        probs = _softmax(z)
        return np.where(probs < min_p * probs.max(), -np.inf, z)

    steps = {"top_k": top_k_step if top_k else None,
             "top_p": top_p_step if top_p is not None else None,
             "min_p": min_p_step if min_p is not None else None}
    names = ("min_p", "top_k", "top_p") if order == "vllm" else ("top_k", "top_p", "min_p")
    for name in names:
        if steps[name] is not None:
            z = steps[name](z)
    return _softmax(z)
