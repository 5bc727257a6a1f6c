"""The suite's XLA:CPU compile settings, in a module of their own so that helpers which start
subprocesses can read them without importing ``conftest`` (which sets them in the environment).
``tests/conftest.py`` explains the choice."""

#: XLA_FLAGS the suite adds before JAX starts (optimisation level 0, the older emitters, one LLVM
#: module per program): compilation about 1.5x faster, the programs slower.
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                "--xla_cpu_parallel_codegen_split_count=1")


def without_fast_compile(flags: str) -> str:
    """``XLA_FLAGS`` less the suite's: for a subprocess that runs a few programs on large arrays,
    which level 0's code runs several times slower."""
    return " ".join(flags.replace(FAST_COMPILE, "").split())
