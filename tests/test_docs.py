"""The documentation runs and builds.

* Every ```` ```python ```` block of ``README.md`` and of ``docs/**/*.md`` is executed. The blocks
  of one page run in order in one fresh namespace, as a reader would run them. A block marked
  ``no-run`` (```` ```python {.no-run} ````, which Markdown renders as Python) is skipped. The
  pages are dealt to ``DOC_RUNS`` subprocesses (compiled programs are shared between the pages of
  one, and the runs share the suite's compilation cache when it has one), which the xdist workers
  share out, with the suite's strictness: warnings are errors and ``jax_numpy_rank_promotion`` is
  ``"raise"``. A failure names the page and the block's line.
* ``mkdocs build --strict`` builds the site (skipped when mkdocs or mkdocstrings is missing), once
  for the module: its API pages show the docstrings' examples as code blocks, and its formulas are
  marked for KaTeX, which the site serves itself.
* The home page links every guide.
* The README's set-up command is the one CI runs, and its relative links exist.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import run_batch

# End-to-end runs (every README and guide code block in a subprocess, and the site build): part
# of the full suite, skipped by the inner loop's `-m "not slow"`.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")

RUNNER = r"""
import json
import sys
import traceback
import warnings

warnings.simplefilter("error")  # as the suite's filterwarnings = ["error"]
# as pyproject.toml: the workers share the compilation cache, and JAX does not write atomically
warnings.filterwarnings("ignore", "Error (reading|writing) persistent compilation cache entry")

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")  # as tests/conftest.py

pages = json.loads(open(sys.argv[1]).read())
results = {}
for page in pages:
    namespace = {"__name__": "__main__"}
    results[page["path"]] = None
    for line, code in page["blocks"]:
        # Pad with newlines so that tracebacks give the line numbers of the Markdown file.
        source = "\n" * line + code
        try:
            exec(compile(source, page["path"], "exec"), namespace)
        except BaseException:
            results[page["path"]] = (f"the block at {page['path']}:{line} failed:\n"
                                     + traceback.format_exc())
            break
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ``python`` fenced blocks of a Markdown text that should run: ``(line, code)`` pairs,
    ``line`` the 0-based index of the block's first code line."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        words = match["info"].strip().split()
        start = i + 1
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence)
                                      and set(lines[i].strip()) == {fence[0]}):
            i += 1
        if words and words[0] == "python" and "no-run" not in match["info"]:
            code = "\n".join(line[indent:] for line in lines[start:i])
            blocks.append((start, code + "\n"))
        i += 1
    return blocks


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def test_fence_parser():
    text = ("x\n```python\na = 1\n```\n```bash\nls\n```\n```python {.no-run}\nboom()\n```\n"
            "- item\n\n  ```python\n  b = a + 1\n  ```\n")
    assert python_blocks(text) == [(2, "a = 1\n"), (13, "b = a + 1\n")]


def test_every_page_has_runnable_examples_where_expected():
    for name in ["README.md", "docs/index.md", "docs/guides/decoders.md",
                 "docs/guides/new-decoder.md"]:
        assert python_blocks((ROOT / name).read_text()), name


def run_pages(pages, tmp):
    """Runs the pages' blocks in one subprocess; ``{page name: None or the failure}``."""
    pages = [{"path": _name(p), "blocks": python_blocks(p.read_text())} for p in pages]
    # The suite's compilation cache comes with the environment (tests/conftest.py sets it).
    # Run from an empty folder: a page may write files, never into the repository.
    return run_batch("the documentation runner", RUNNER, pages, [p["path"] for p in pages], tmp,
                     cwd=tmp, env=dict(os.environ, MPLBACKEND="Agg"))


CODE_PAGES = [p for p in PAGES if python_blocks(p.read_text())]
# CPU seconds each page took in a subprocess of its own (measured on 4d3eba3, a loaded 2-core
# machine, start-up included; only the ratios matter): the pages are dealt, longest first, to the
# least loaded of DOC_RUNS runs, so that the runs take about as long. A page not listed counts as
# the median.
PAGE_SECONDS = {
    "docs/guides/adaptive-drafting.md": 23, "docs/guides/multi-draft.md": 16,
    "docs/guides/real-model-pairs.md": 15, "docs/guides/token-trees.md": 14,
    "docs/guides/cost.md": 10, "docs/guides/decoders.md": 9, "docs/guides/neural-models.md": 9,
    "docs/guides/traversal.md": 9, "docs/guides/new-decoder.md": 8,
    "docs/guides/check-your-sampler.md": 7, "docs/guides/serving.md": 7,
    "docs/guides/models.md": 6, "docs/guides/parallel-drafters.md": 6,
    "docs/guides/provenance.md": 6, "docs/guides/scale.md": 6, "README.md": 5,
    "docs/guides/exact-theory.md": 5, "docs/guides/engine-metrics.md": 4,
    "docs/guides/lossy-rules.md": 4, "docs/guides/tuning.md": 4, "docs/guides/audits.md": 3,
    "docs/guides/checks.md": 3, "docs/guides/reproducing.md": 3, "docs/index.md": 3,
    "docs/guides/history-dependent.md": 2,
}
DOC_RUNS = 2


def _deal(pages, runs):
    """``{page name: run}``: longest first, each page to the run with the least time so far."""
    median = sorted(PAGE_SECONDS.values())[len(PAGE_SECONDS) // 2]
    loads, run_of = [0.0] * runs, {}
    for name in sorted((_name(p) for p in pages), key=lambda n: -PAGE_SECONDS.get(n, median)):
        run = loads.index(min(loads))
        run_of[name] = run
        loads[run] += PAGE_SECONDS.get(name, median)
    return run_of


RUN_OF = _deal(CODE_PAGES, DOC_RUNS)
_RESULTS = {}  # run -> {page: None or the failure}, each run once per process


# The test ids start with the run ("run0:README.md"): tests/conftest.py schedules a run's pages
# on one worker, and the workers take one run each.
@pytest.mark.parametrize("page", CODE_PAGES, ids=lambda p: f"run{RUN_OF[_name(p)]}:{_name(p)}")
def test_page_code_runs(page, tmp_path_factory):
    run = RUN_OF[_name(page)]
    if run not in _RESULTS:
        pages = [p for p in CODE_PAGES if RUN_OF[_name(p)] == run]
        _RESULTS[run] = run_pages(pages, tmp_path_factory.mktemp(f"docs{run}"))
    failure = _RESULTS[run][_name(page)]
    assert failure is None, failure


def test_readme_setup_is_what_ci_runs():
    if not (ROOT / ".ci" / "run").exists():
        pytest.skip("no .ci/run here (not a git checkout)")
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    commands = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text())
    assert len(commands) >= 2
    assert commands[1].endswith(ci), (commands[1], ci)


def test_home_page_lists_every_guide():
    linked = set(re.findall(r"\]\((guides/[^)#\s]+\.md)", (ROOT / "docs" / "index.md").read_text()))
    guides = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs" / "guides").glob("*.md")}
    assert guides <= linked, f"docs/index.md's table does not link {sorted(guides - linked)}"


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not re.match(r"[a-z]+://", target):
            assert (ROOT / target).exists(), target


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's tests by ``mkdocs build --strict``."""
    if not (ROOT / "mkdocs.yml").exists():
        pytest.skip("no mkdocs.yml here (not a git checkout)")
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")
    site = tmp_path_factory.mktemp("site")
    # No --quiet: it hides the warnings, and --strict then has nothing to fail on.
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return site


def test_site_builds_strictly(site):
    decoders = (site / "api" / "decoders" / "index.html").read_text()
    assert "BatchSpeculative" in decoders and "laws" in decoders  # the docstrings were rendered
    assert (site / "guides" / "new-decoder" / "index.html").exists()


# A docstring section's title in mkdocstrings' HTML, and the start of the next object or section.
SECTION_TITLE = '<span class="doc-section-title">'
NEXT_BLOCK = re.compile(r'<span class="doc-section-title">|<div class="doc doc-object')


def test_site_renders_examples_as_code_and_marks_math(site):
    """The docstrings' ``Example:`` sections are highlighted ``pycon`` blocks, prompts and outputs
    included, not the nested blockquotes Markdown makes of ``>>>`` (docs/_ext/griffe_examples.py);
    formulas are left to KaTeX (``pymdownx.arithmatex``), which the site serves itself."""
    examples = {}
    for page in sorted((site / "api").glob("*/index.html")):
        html = page.read_text()
        name = page.parent.name
        assert "<blockquote>\n<blockquote>" not in html, name  # no ">>>" as nested quotes
        assert '<details class="example"' not in html, name  # nor as an admonition
        sections = html.split(SECTION_TITLE)[1:]
        examples[name] = [s for s in sections if s.startswith("Example")]
        for section in examples[name]:
            body = NEXT_BLOCK.split(section, maxsplit=1)[0]
            assert "<blockquote>" not in body, (name, body[:400])
            assert '<div class="highlight">' in body, (name, body[:400])
            assert '<span class="gp">&gt;&gt;&gt; </span>' in body, (name, body[:400])
    assert examples["pairs"] and examples["theory"], {k: len(v) for k, v in examples.items()}
    # Math: the TeX kept for the browser, and KaTeX (script, auto-render, styles, fonts) local.
    for page in ("index.html", "guides/reproducing/index.html"):
        html = (site / page).read_text()
        assert '<span class="arithmatex">\\(' in html, page
        for asset in ("javascripts/katex.js", "javascripts/katex/katex.min.js",
                      "javascripts/katex/contrib/auto-render.min.js",
                      "javascripts/katex/katex.min.css"):
            assert re.search(rf'(src|href)="(\.\./)*{re.escape(asset)}"', html), (page, asset)
        assert not re.search(r'<(script|link)[^>]*(src|href)="(https?:)?//', html), page
    css = (site / "javascripts" / "katex" / "katex.min.css").read_text()
    fonts = re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)
    assert fonts and all((site / "javascripts" / "katex" / f).exists() for f in fonts)
