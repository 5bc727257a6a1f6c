"""``python -m specjax``: the command line (``specjax.cli``)."""

import sys

try:
    from specjax.cli import main
except KeyboardInterrupt:  # Ctrl-C while JAX loads: nothing was written yet
    sys.stderr.write("python -m specjax: interrupted\n")
    sys.exit(130)

__all__ = []

if __name__ == "__main__":
    main()
