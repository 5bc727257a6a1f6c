"""Names that left a package's public surface but still resolve, with a deprecation warning.

``moved(package, homes)`` builds the module-level ``__getattr__`` (PEP 562) of ``package``: each
name of ``homes`` resolves to the attribute of the same name in its new home module, with a
``DeprecationWarning`` naming that home; any other name raises ``AttributeError`` as usual. The
names are not module attributes, so they appear in neither ``__all__`` nor ``dir(package)``.
"""

from __future__ import annotations

import importlib
import warnings

__all__ = ["COMPAT", "moved"]

COMPAT = "specjax.compat"


def moved(package: str, homes: dict[str, str]):
    """The ``__getattr__`` of ``package`` for the names of ``homes`` (name -> home module)."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if home == COMPAT:
            advice = f"it is deprecated, and {home}.{name} says what to call instead"
        else:
            advice = f"import it from {home}"
        warnings.warn(f"{package}.{name} moved to {home}.{name}: {advice}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(home), name)

    return __getattr__
