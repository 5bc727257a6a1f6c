"""Files written whole or not at all: ``atomic_write`` (a temporary file in the destination's
folder, renamed over it), used by every writer of specjax (``Recording.save``, the command
line's figures, summaries and bench tables)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import uuid

__all__ = ["TEMPORARY_SUFFIX", "atomic_write", "temporary_name"]

TEMPORARY_SUFFIX = ".tmp"  # what ``atomic_write``'s temporary files end with


def temporary_name(path) -> pathlib.Path:
    """A fresh temporary path beside ``path``: hidden, ``.{name}.{random}.tmp``."""
    path = pathlib.Path(path)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{TEMPORARY_SUFFIX}")


@contextlib.contextmanager
def atomic_write(path, binary: bool = False):
    """Writes ``path`` all at once: yields a file open on a temporary file in the same folder,
    then moves it onto ``path`` (``os.replace``) once the block ends without an exception.

    An exception (or Ctrl-C) inside the block removes the temporary file and leaves ``path``
    as it was: whole, from an earlier write, or absent. A reader never sees a partial file.

    Args:
      path: the file to write.
      binary: open the file in binary mode (``"wb"``); otherwise text, UTF-8.
    """
    path = pathlib.Path(path)
    tmp = temporary_name(path)
    # O_EXCL: never reuse a file that exists; 0o666 (less the umask): the permissions a plain
    # open() gives, where tempfile.mkstemp would give 0o600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
