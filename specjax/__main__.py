"""``python -m specjax``: the command line (``specjax.cli``)."""

from specjax.cli import main

if __name__ == "__main__":
    main()
