"""The page "Recipes with optax and Flax" runs: its code blocks execute in order."""

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "howto" / "recipes.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(text: str) -> list[str]:
  """The ```python blocks of a Markdown page, in order."""
  return _BLOCK.findall(text)


def test_block_extraction():
  text = "a\n```python\nx = 1\n```\n```text\nno\n```\n```python\ny = x\n```\n"
  assert blocks(text) == ["x = 1\n", "y = x\n"]


@pytest.mark.slow  # trains each recipe's model: about 50 s of a loaded core
@pytest.mark.timeout(600)
def test_recipes_page_executes():
  code = blocks(PAGE.read_text(encoding="utf-8"))
  assert len(code) >= 9
  namespace: dict = {"__name__": "recipes"}
  for i, block in enumerate(code):
    try:
      exec(compile(block, f"{PAGE.name}[block {i}]", "exec"), namespace)
    except Exception as e:
      raise AssertionError(f"block {i} of {PAGE.name} failed:\n{block}") from e
