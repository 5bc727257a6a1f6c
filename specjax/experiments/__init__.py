"""The paper's experiments: reproduction, report and figures; and the benchmarks (``bench``, with
their NumPy references in ``references``)."""

__all__ = []
