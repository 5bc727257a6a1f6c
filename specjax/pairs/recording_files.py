"""Reading and writing a ``Recording`` in its ``.npz`` layout (``specjax.pairs.recording``).

* **Paths.** ``save(path)`` writes ``path`` itself when it ends in ``.npz``, else ``path +
  ".npz"`` (NumPy's own rule); ``load(path)`` reads ``path``, or ``path + ".npz"`` when ``path``
  does not exist, so ``save(p)`` then ``load(p)`` round-trips for every ``p``. A folder (an
  existing one, or a path ending in a separator) is refused: it names no file.
* **Atomic replacement.** ``save`` writes a temporary file in the destination's folder and renames
  it over the destination (``os.replace``), so a save that fails midway (a full disk, a file-size
  limit, an interrupt) leaves the previous file whole and no partial one; an existing file is
  replaced.
* **Checked reads.** ``load`` checks everything it reads as ``from_arrays`` and
  ``from_statistics`` check their arguments (shapes, probabilities in ``[0, 1]``, a positive
  target probability of every recorded token), and stored rates too (shape ``(B, T)``, finite,
  in ``[0, 1]``); every error names the file.
* **Rate labels.** A decoder's rates are stored under ``rate_label(decoder)``: its ``repr`` with
  ``lookahead=None``, where a function (a ``RejectionRule``'s ``accept_prob``) is written as its
  module and qualified name instead of its memory address, so that another process, building the
  same rule, reads them back.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _files

__all__ = ["load", "rate_label", "resolve_path", "save"]


def _label_of(value) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={_label_of(getattr(value, f.name))}"
                           for f in dataclasses.fields(value) if f.repr)
        return f"{type(value).__qualname__}({fields})"
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', None) or '?'}.{value.__qualname__}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_label_of(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    return repr(value)


def rate_label(decoder) -> str:
    """The key a decoder's rates are stored under: its ``repr`` (with ``lookahead=None``, as
    ``rate_key`` makes it), functions written as ``module.qualname`` (module docstring).

    Example:
      >>> import specjax
      >>> from specjax.pairs.recording import rate_key
      >>> rate_label(rate_key(specjax.BatchSpeculative(2, lookahead=3)))
      'BatchSpeculative(num_drafts=2, replacement=True, lookahead=None)'
    """
    return _label_of(decoder)


def _check_path_type(path):
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a file name (a str or os.PathLike), got {path!r}"[:300])
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise ValueError("path must name a file, got an empty string")
    return path


def resolve_path(path, *, for_writing: bool) -> str:
    """The file ``save`` writes or ``load`` reads for ``path`` (module docstring).

    Raises:
      ValueError: ``path`` is not a str or path, names a folder, or (reading) neither ``path``
        nor ``path + ".npz"`` exists; (writing) its folder does not exist.
    """
    path = _check_path_type(path)
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)) or os.path.isdir(path):
        raise ValueError(f"path: {path!r} is a folder; give a file name, e.g. "
                         f"{os.path.join(path, 'recording.npz')!r}")
    if for_writing:
        target = path if path.endswith(".npz") else path + ".npz"
        if os.path.isdir(target):
            raise ValueError(f"path: {target!r} (where {path!r} is saved) is a folder")
        folder = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(folder):
            raise ValueError(f"path: the folder {folder!r} of {path!r} does not exist")
        return target
    if os.path.exists(path):
        return path
    if not path.endswith(".npz") and os.path.isfile(path + ".npz"):
        return path + ".npz"
    also = "" if path.endswith(".npz") else f" (nor {path + '.npz'!r})"
    raise ValueError(f"path: no file {path!r}{also}")


def save(recording, path) -> str:
    """Writes ``recording`` to ``path`` atomically (module docstring); returns the file written.
    """
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable
           for x in jax.tree.leaves(recording)):
        raise ValueError(
            "recording: its arrays span several processes (jax.distributed), so no process "
            "holds all of it; gather it on every process first, "
            "specjax.sampling.sharding.gather(recording), and save that")
    target = resolve_path(path, for_writing=True)
    arrays = {"tokens": np.asarray(recording.tokens),
              "draft_prob": np.asarray(recording.draft_prob),
              "target_prob": np.asarray(recording.target_prob)}
    if recording.weights is not None:
        arrays["weights"] = np.asarray(recording.weights)
    if recording.lengths is not None:
        arrays["lengths"] = np.asarray(recording.lengths)
    if recording.draft_probs is not None:
        arrays["draft_probs"] = np.asarray(recording.draft_probs)
        arrays["target_probs"] = np.asarray(recording.target_probs)
    labels = [rate_label(entry.decoder) for entry in recording.rates]
    clash = {label for label in labels if labels.count(label) > 1}
    if clash:
        raise ValueError(
            f"recording: two of its decoders' rates would be stored under one label "
            f"{sorted(clash)[0]!r} (rules built from functions of the same name, such as two "
            f"lambdas of one module): give the functions distinct names")
    for label, entry in zip(labels, recording.rates):
        arrays[f"root_rejection/{label}"] = np.asarray(entry.root_rejection)
        arrays[f"rejection/{label}"] = np.asarray(entry.rejection)
    with _files.atomic_write(target, binary=True) as file:
        np.savez(file, **arrays)
    return target


def _read(path: str) -> dict:
    """Every array of the ``.npz`` file at ``path`` (errors name the file). The file is opened
    here, not by ``np.load``, which leaves it open when the archive is damaged."""
    errors = (OSError, EOFError, ValueError, zipfile.BadZipFile)
    try:
        with open(path, "rb") as file:
            try:
                data = np.load(file, allow_pickle=False)
            except errors as error:
                raise ValueError(f"path: {path!r} is not a readable .npz archive "
                                 f"({type(error).__name__}: {error})") from None
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError(
                    f"path: {path!r} holds a single NumPy array (a .npy file), not a .npz "
                    f"archive of named arrays; write one with np.savez(path, tokens=..., "
                    f"draft_prob=..., target_prob=...)")
            with data:
                try:
                    return {name: data[name] for name in data.files}
                except errors as error:
                    raise ValueError(f"path: {path!r} is a damaged .npz archive (truncated or "
                                     f"corrupt: {type(error).__name__}: {error})") from None
    except OSError as error:  # opening: a permission, a special file
        raise ValueError(f"path: {path!r} cannot be read ({error})") from None


def _check_rates(path: str, name: str, values, shape) -> jax.Array:
    values = np.asarray(values)
    if values.shape != shape or not np.issubdtype(values.dtype, np.floating):
        raise ValueError(f"path: {path!r}: {name!r} must be a float array of shape (B, T) = "
                         f"{shape}, got {values.shape} {values.dtype}")
    if not np.isfinite(values).all() or (values < 0).any() or (values > 1).any():
        finite = values[np.isfinite(values)]
        seen = f"values from {finite.min():.3g} to {finite.max():.3g}" if finite.size else \
            "no finite value"
        raise ValueError(f"path: {path!r}: {name!r} must hold rates in [0, 1] (finite), got "
                         f"{seen}" + (" and NaN or inf" if finite.size < values.size else ""))
    return jnp.asarray(values)


def load(cls, path, *, decoders=(), keep_rows=None):
    """``Recording.load`` (its docstring)."""
    from specjax import _checks  # noqa: PLC0415
    from specjax.pairs.recording import DecoderRates  # noqa: PLC0415
    from specjax.pairs.recording import check_decoders  # noqa: PLC0415

    if keep_rows is not None:
        _checks.check_bool("keep_rows", keep_rows)
    decoders = check_decoders(decoders)
    path = resolve_path(path, for_writing=False)
    arrays = _read(path)
    if "tokens" not in arrays:
        raise ValueError(f"path: {path!r} has no 'tokens' array (see the .npz layout in "
                         "specjax.pairs.recording)")
    weights, lengths = arrays.get("weights"), arrays.get("lengths")
    try:
        if "draft_probs" in arrays and "target_probs" in arrays:
            keep = True if keep_rows is None else keep_rows
            return cls.from_arrays(arrays["tokens"], arrays["draft_probs"],
                                   arrays["target_probs"], weights=weights, lengths=lengths,
                                   decoders=decoders, keep_rows=keep)
        if "draft_prob" not in arrays or "target_prob" not in arrays:
            raise ValueError(f"path: {path!r} needs 'draft_prob' and 'target_prob' (B, T) or "
                             f"the rows 'draft_probs' and 'target_probs' (B, T, V)")
        rec = cls.from_statistics(arrays["tokens"], arrays["draft_prob"],
                                  arrays["target_prob"], weights=weights, lengths=lengths)
    except ValueError as error:
        message = str(error)
        if message.startswith("path: "):
            raise
        raise ValueError(f"path: {path!r}: {message}") from None
    rates = []
    shape = tuple(rec.target_prob.shape)
    for decoder in decoders:
        labels = (rate_label(decoder), repr(decoder))  # repr: files written before the labels
        found = next((label for label in labels if f"root_rejection/{label}" in arrays
                      and f"rejection/{label}" in arrays), None)
        if found is None:
            stored = sorted(name.split("/", 1)[1] for name in arrays
                            if name.startswith("root_rejection/"))
            raise ValueError(f"decoders: {path!r} holds no rates of {labels[0]} and no rows to "
                             f"compute them from (rates stored: {stored or 'none'})"[:600])
        rates.append(DecoderRates(
            decoder,
            _check_rates(path, f"root_rejection/{found}", arrays[f"root_rejection/{found}"],
                         shape).astype(rec.target_prob.dtype),
            _check_rates(path, f"rejection/{found}", arrays[f"rejection/{found}"],
                         shape).astype(rec.target_prob.dtype)))
    return rec._replace(rates=tuple(rates))
