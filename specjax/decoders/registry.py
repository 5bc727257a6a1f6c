"""Every decoder registered by construction: its own example cases, from which the conformance
suite and the docs' capability table are built.

A decoder class registers itself by defining the class method ``example_cases()`` (declared on
``specjax.decoders.base.Decoder``, whose default ``{}`` means "not registered"): a dict from a
short, unique case name to a decoder of that class with representative settings. Nothing lists
the decoders by hand: ``registered_decoders`` walks the subclasses of ``Decoder`` (every module
of ``specjax.decoders`` imported first, so a new file is found without an import elsewhere) and
keeps the public classes of the given packages that define ``example_cases`` themselves (a
subclass that inherits its parent's cases is not registered twice). ``decoder_cases`` gathers
their cases, which the test suite runs through every entry point (``tests/sampler_cases.py``),
and ``capability_table`` renders the table of ``docs/guides/decoders.md`` from the cases'
declared capabilities. After adding or changing a decoder, refresh that table with::

    python -m specjax.decoders.registry docs/guides/decoders.md

(``tests/test_registry.py`` fails, naming this command, while the page differs from the table).

Example:
    >>> from specjax.decoders import registry
    >>> cases = registry.decoder_cases()
    >>> cases["sd K=3"]
    Speculative(lookahead=3)
    >>> "| `sd K=3` | `Speculative` | token-wise | yes |" in registry.capability_table()
    True
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
import sys

from specjax import _files
from specjax.decoders.base import Decoder
from specjax.decoders.base import TokenwiseDecoder

__all__ = [
    "TABLE_BEGIN",
    "TABLE_END",
    "capability_table",
    "decoder_cases",
    "refresh_page",
    "registered_decoders",
]

#: The markers around the generated table in a Markdown page (``refresh_page`` rewrites what
#: lies between them).
TABLE_BEGIN = ("<!-- decoder capabilities: generated from each decoder's example_cases by "
               "`python -m specjax.decoders.registry docs/guides/decoders.md`; do not edit -->")
TABLE_END = "<!-- end of the generated decoder capabilities -->"

#: The model kinds of ``Decoder.model_kinds``, by the letters of the guide's support table
#: (every decoder runs on ``MarkovChain``s: ``M``).
_MODEL_LETTERS = {"finite_state": "F", "protocol": "P"}


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def registered_decoders(packages: tuple[str, ...] = ("specjax",)) -> list[type]:
    """The decoder classes that register themselves: every public subclass of ``Decoder``
    defined in a module of ``packages`` (a module's dotted name or a prefix of it) that defines
    ``example_cases`` itself, token-wise decoders first, then call-level ones, each by name.

    Args:
      packages: the modules (and their submodules) whose decoders to list; the default is
        specjax's own. Pass a module's name to list the decoders a user defines there too.
    """
    import specjax.decoders  # noqa: PLC0415 - the package this module belongs to

    for module in pkgutil.walk_packages(specjax.decoders.__path__, "specjax.decoders."):
        importlib.import_module(module.name)  # a new file is found without an import elsewhere
    found, todo = {}, [Decoder]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if "example_cases" in vars(sub) and not sub.__name__.startswith("_") \
                    and _in(sub.__module__, packages):
                found[sub] = None
    return sorted(found, key=lambda c: (not issubclass(c, TokenwiseDecoder), c.__name__))


def decoder_cases(packages: tuple[str, ...] = ("specjax",)) -> dict[str, Decoder]:
    """Every registered decoder's ``example_cases()``, in ``registered_decoders``' order.

    Raises:
      ValueError: two cases share a name, or a case is not a decoder of exactly the class that
        gives it (a class's cases stand for that class).
    """
    cases = {}
    for cls in registered_decoders(packages):
        for name, decoder in cls.example_cases().items():
            if type(decoder) is not cls:
                raise ValueError(f"{cls.__name__}.example_cases: the case {name!r} is a "
                                 f"{type(decoder).__name__}, not a {cls.__name__}")
            if name in cases:
                raise ValueError(f"{cls.__name__}.example_cases: the case name {name!r} is "
                                 f"taken by a {type(cases[name]).__name__} case")
            cases[name] = decoder
    return cases


def _row(name: str, decoder: Decoder) -> str:
    lossless = {True: "yes", False: "no", None: "per rule"}[decoder.lossless]
    models = " ".join(["M"] + [_MODEL_LETTERS[kind] for kind in decoder.model_kinds])
    cells = [f"`{name}`", f"`{type(decoder).__name__}`",
             "token-wise" if isinstance(decoder, TokenwiseDecoder) else "call-level", lossless,
             models, "yes" if decoder.varies_lookahead else "—", f'`"{decoder.recording_reads}"`']
    return "| " + " | ".join(cells) + " |"


def capability_table(packages: tuple[str, ...] = ("specjax",)) -> str:
    """The Markdown table of every registered case's declared capabilities, one row per case:
    its name, class, protocol (token-wise or call-level), ``lossless``, the model kinds it runs
    on (``M``, ``F``, ``P`` as in the guide's support table), whether ``with_lookahead`` varies
    its lookahead, and what an estimate from a recording reads (``recording_reads``)."""
    lines = ["| case | decoder | protocol | lossless | models | `with_lookahead` | "
             "`recording_reads` |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_row(name, decoder) for name, decoder in decoder_cases(packages).items()]
    return "\n".join(lines)


def _replace_table(text: str, table: str, where: str) -> str:
    if text.count(TABLE_BEGIN) != 1 or text.count(TABLE_END) != 1 \
            or text.index(TABLE_BEGIN) > text.index(TABLE_END):
        raise ValueError(f"{where} must hold the markers TABLE_BEGIN and TABLE_END of "
                         f"specjax.decoders.registry once each, in that order")
    head, rest = text.split(TABLE_BEGIN)
    _, tail = rest.split(TABLE_END)
    return f"{head}{TABLE_BEGIN}\n\n{table}\n\n{TABLE_END}{tail}"


def refresh_page(path, packages: tuple[str, ...] = ("specjax",)) -> bool:
    """Rewrites the generated table of the Markdown page ``path`` (between ``TABLE_BEGIN`` and
    ``TABLE_END``) as ``capability_table(packages)``; returns whether the page changed."""
    path = pathlib.Path(path)
    text = path.read_text()
    new = _replace_table(text, capability_table(packages), str(path))
    if new != text:
        with _files.atomic_write(path) as file:  # an interrupted refresh keeps the page
            file.write(new)
    return new != text


def main(argv: list[str]) -> int:
    """``python -m specjax.decoders.registry PAGE...``: refresh each page's table."""
    if not argv:
        print(__doc__.split("Example:")[0].strip().splitlines()[0], file=sys.stderr)
        print("usage: python -m specjax.decoders.registry PAGE.md [PAGE.md ...]", file=sys.stderr)
        return 2
    for page in argv:
        print(f"{page}: {'refreshed' if refresh_page(page) else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
