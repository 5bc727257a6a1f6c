"""A Griffe extension for the API reference: specjax's docstrings title their doctest sections
``Example:``, which Griffe's Google-style parser does not know (it knows ``Examples:``) and turns
into an admonition, whose ``>>>`` lines Markdown then renders as nested blockquotes. This
extension retitles them ``Examples: Example:`` in the parsed copy only (the source and its
doctests are unchanged): an examples section titled "Example:", which mkdocstrings renders as
``pycon`` code blocks, prompts and outputs included.

mkdocs.yml loads it (``plugins: mkdocstrings: handlers: python: options: extensions``).
"""

import re

import griffe

# "Example:" alone on its line, as a section title (the parser's own rule: indented contents below).
_TITLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Retitles each docstring's ``Example:`` sections as ``Examples: Example:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        docstring = obj.docstring
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _TITLE.sub(r"\g<indent>Examples: Example:", docstring.value)
