"""A progress bar on standard error (tqdm), one step per unit of work."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """A tqdm progress bar on standard error, one ``step`` per unit of work (a simulation chunk,
    an experiment, a figure).

    ``Progress(total, enabled=False)`` shows nothing (tqdm's ``disable``) but still counts. The
    bar closes itself at the last step (``done == total``), printing its final state; ``close()``
    ends it early (or use the ``Progress`` as a context manager).

    Args:
      total: the number of steps.
      enabled: show the bar.
    """

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        # sys.stderr is looked up now, not at import, so a redirected stderr (pytest's capsys,
        # contextlib.redirect_stderr) receives the bar.
        self._bar = tqdm(total=total, disable=not enabled, file=sys.stderr, leave=True,
                         dynamic_ncols=True, unit="step")

    def step(self, label: str) -> None:
        """Marks one unit of work done; ``label`` (what was done) is shown beside the bar."""
        self.done += 1
        if self.enabled:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
        if self.done == self.total:
            self.close()

    def close(self) -> None:
        """Ends the bar (idempotent)."""
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
