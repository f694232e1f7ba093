"""Griffe extension of the stiefax docs: ``Example:`` sections render as examples.

The library's docstrings open their doctests with ``Example:`` (Google style); griffe
names that section ``Examples:`` and would otherwise render an ``Example:`` block as an
admonition of Markdown, in which ``>>>`` lines become block quotes. This rewrites the
section title before the docstring is parsed, so each doctest renders as a highlighted
console session.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
  """Renames ``Example:`` section titles to ``Examples:``."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None:
      obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
