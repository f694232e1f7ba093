"""The documentation: complete docstrings for the public API, and a strict site build.

The build (``python -m mkdocs build --strict``) executes the notebooks, fails on any
warning, and fails on an undocumented public symbol (``docs/hooks/stiefax_docs.py``).
The docs extra is part of the test environment (``pip install -e ".[test,experiments,docs]"``):
without it these tests fail rather than skip.
"""

import importlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "stiefax_docs.py"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _hook():
  spec = importlib.util.spec_from_file_location("stiefax_docs_hook", HOOK)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def hook():
  return _hook()


@pytest.mark.parametrize(
  "module",
  [
    "mkdocs",
    "material",
    "mkdocstrings",
    "mkdocstrings_handlers.python",
    "mkdocs_jupyter",
    "griffe",
    "ipykernel",
    "nbconvert",
    "mathjax",
  ],
)
def test_docs_extra_is_installed(module):
  try:
    importlib.import_module(module)
  except ImportError as e:
    pytest.fail(f"{module} is missing ({e}); install the docs extra: pip install -e '.[docs]'")


def test_every_public_callable_has_example_args_and_returns(hook):
  symbols = hook.public_symbols()
  assert len(symbols) > 60  # the walk reached every module's __all__
  problems = hook.undocumented()
  assert not problems, "incomplete docstrings:\n" + "\n".join(problems)


def test_docstring_check_rejects_incomplete_docstrings(hook):
  def bare(x):
    """Does something."""

  def no_returns(x):
    """Does something.

    Example:
      >>> no_returns(1)

    Args:
      x: a thing.
    """

  def complete(x):
    """Does something.

    Example:
      >>> complete(1)

    Args:
      x: a thing.

    Returns:
      Nothing.
    """

  class Plain:
    """A class with no example."""

  class Described:
    """A class.

    Attributes:
      a: a field.
    """

  assert hook.docstring_problems(bare) == [
    "an Example (>>>)",
    "an Args: section",
    "a Returns: section",
  ]
  assert hook.docstring_problems(no_returns) == ["a Returns: section"]
  assert hook.docstring_problems(complete) == []
  assert hook.docstring_problems(Plain) == ["an example (>>>) or an Attributes: section"]
  assert hook.docstring_problems(Described) == []
  assert hook.docstring_problems(lambda: None) != []  # no docstring at all


def test_api_pages_render_every_public_symbol(hook):
  directives = hook.api_directives(ROOT / "docs")
  assert hook.unrendered(directives) == []
  # Control: without the API pages every symbol is reported.
  assert len(hook.unrendered([])) == len(hook.public_symbols())


def test_notebooks_are_stored_without_outputs():
  assert len(NOTEBOOKS) >= 3
  for path in NOTEBOOKS:
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, path
    assert all(not c.get("outputs") for c in code), f"{path.name}: clear its outputs"
    assert nb["metadata"]["kernelspec"]["language"] == "python"


@pytest.mark.slow  # the whole site with its three notebooks executed (.ci/run runs it)
@pytest.mark.timeout(600)
def test_strict_build_executes_the_notebooks(tmp_path):
  site = tmp_path / "site"
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    NO_MKDOCS_2_WARNING="1",
    PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
  )
  proc = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=540,
  )
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
  for page in (
    "index.html",
    "concepts/index.html",
    "api/stiefax/index.html",
    "api/certificates/index.html",
    "reproduction/index.html",
  ):
    assert (site / page).is_file(), page
  # MathJax is served from the site (the math renders offline), never from a CDN.
  assert (site / "javascripts" / "mathjax" / "tex-mml-chtml.js").is_file()
  assert (site / "javascripts" / "mathjax" / "output" / "chtml" / "fonts").is_dir()
  index = (site / "index.html").read_text()
  assert "javascripts/mathjax/tex-mml-chtml.js" in index and "unpkg" not in index
  assert (site / "howto" / "recipes" / "index.html").is_file()
  api = (site / "api" / "stiefax" / "index.html").read_text()
  assert "stiefax.riemannian_adam" in api and "stiefax.FrameSpec" in api
  for path in NOTEBOOKS:
    html = (site / "notebooks" / path.stem / "index.html").read_text()
    assert "data:image/png;base64" in html, f"{path.name}: no executed plot in the page"
  quick = (site / "notebooks" / "01_quickstart" / "index.html").read_text()
  # A printed result (not in the source): "loss 0.7298 -> 0.0058" for both arms.
  assert len(re.findall(r"loss \d\.\d{4} -(?:>|&gt;) \d\.\d{4}", quick)) == 2


def _griffe_extension():
  spec = importlib.util.spec_from_file_location(
    "griffe_examples", ROOT / "docs" / "hooks" / "griffe_examples.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_sphinx_roles_become_cross_references():
  ext = _griffe_extension()
  text = ext.markdown_docstring(
    "Use :func:`qk_frames` and :class:`stiefax.FrameSpec` (see :meth:`FrameSpec.rest`,"
    " :func:`~stiefax.geometry.polar`, :func:`jax.numpy.linalg.svd`)::\n\n    code::\n",
    "stiefax._layouts",  # the module that defines qk_frames,
  )
  assert text == (
    "Use [`qk_frames`][stiefax.layouts.qk_frames] and [`stiefax.FrameSpec`][stiefax.FrameSpec]"
    " (see [`FrameSpec.rest`][stiefax.FrameSpec.rest], [`polar`][stiefax.geometry.polar],"
    " `jax.numpy.linalg.svd`):\n\n    code:\n"
  )
  # Doctest lines keep their text.
  assert ext.markdown_docstring('  >>> print("a::")\n', "stiefax") == '  >>> print("a::")\n'


def test_raw_markup_check_finds_roles_and_literal_markers(hook):
  assert hook.raw_markup("<p>see <code>x</code> and <pre>a::b\n:func:`y`</pre></p>") == []
  assert len(hook.raw_markup("<p>see :func:<code>qk_labels</code></p>")) == 1
  assert len(hook.raw_markup("<p>The drop-in::</p><pre>code</pre>")) == 1
  assert len(hook.raw_markup("<p>see :class:`FrameSpec`</p>")) == 1
