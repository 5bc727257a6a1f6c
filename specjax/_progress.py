"""A progress bar on standard error (tqdm), one step per unit of work; and the flag of a Ctrl-C
that the program (``python -m specjax``) saw, checked at every step."""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["Progress", "check_interrupt", "request_interrupt"]

# Set by ``python -m specjax``'s SIGINT handler (``specjax.cli.catch_lost_interrupts``, installed
# only when specjax runs as the program), never by specjax as a library: a ``KeyboardInterrupt``
# that the handler raised can be lost (raised inside a garbage-collection callback such as JAX's,
# a ``__del__``, or code that catches it), and the run would go on to its end. Every
# ``Progress.step`` (and ``check_interrupt`` between the cases of ``bench``) raises it again.
_interrupt_requested = False


def request_interrupt() -> None:
    """Marks the run as interrupted: the next ``check_interrupt`` (every ``Progress.step``)
    raises ``KeyboardInterrupt``. Called by the command line's SIGINT handler only."""
    global _interrupt_requested
    _interrupt_requested = True


def check_interrupt() -> None:
    """Raises ``KeyboardInterrupt`` if the program's SIGINT handler saw a Ctrl-C (whether or not
    the ``KeyboardInterrupt`` it raised then was lost); otherwise nothing. The flag stays set:
    every later check raises too."""
    if _interrupt_requested:
        raise KeyboardInterrupt


class Progress:
    """A tqdm progress bar on standard error, one ``step`` per unit of work (a simulation chunk,
    an experiment, a figure).

    ``Progress(total, enabled=False)`` shows nothing (tqdm's ``disable``) but still counts. The
    bar closes itself at the last step (``done == total``), printing its final state; ``close()``
    ends it early (or use the ``Progress`` as a context manager). Each ``step`` first calls
    ``check_interrupt``: under ``python -m specjax``, a Ctrl-C whose ``KeyboardInterrupt`` was
    lost ends the run at the next step (for a library user the flag is never set).

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
        """Marks one unit of work done; ``label`` (what was done) is shown beside the bar.

        Raises:
          KeyboardInterrupt: the program's SIGINT handler saw a Ctrl-C (``check_interrupt``);
            the step is not counted.
        """
        check_interrupt()
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
