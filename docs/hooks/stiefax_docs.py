"""Build hooks of the stiefax documentation (``hooks:`` in mkdocs.yml).

* Every public symbol is documented, or the build fails: each callable in the
  ``__all__`` of the modules in :data:`API_MODULES` needs a docstring with an example
  (a ``>>>`` line), an ``Args:`` section (when it takes parameters) and a ``Returns:``
  section (functions); each class needs a ``>>>`` example or an ``Attributes:``
  section; and every symbol must be rendered by a ``::: name`` directive of an API page
  (``::: module`` renders the whole module).
* No page keeps Sphinx markup (``:func:`` roles, ``::`` literal markers) in its
  rendered HTML; the griffe extension ``griffe_examples.py`` rewrites the docstrings'
  roles as mkdocstrings cross-references.
* Inline code wraps only between the parts of a name (:func:`code_break_points` and
  ``docs/stylesheets/extra.css``), never inside a word.
* MathJax is served from the built site (``javascripts/mathjax/``), so the math renders
  offline: :func:`on_post_build` copies it from the ``django-static-mathjax`` package
  of the docs extra (MathJax 3 as plain files; it needs no Django).
* The table of query/key layouts on ``howto/your-model.md`` is rendered from
  ``stiefax.layouts.LAYOUTS`` (:func:`with_layouts_table`), one row per layout, so the
  page cannot drift from the code; ``python docs/hooks/stiefax_docs.py`` rewrites the
  copy in the Markdown source, which ``tests/test_layouts.py`` compares with the rows.
* The notebooks live in ``notebooks/`` at the repository root (they are run and read on
  their own too); they are added to the site as ``notebooks/*.ipynb``, where the
  mkdocs-jupyter plugin executes them, with the kernel settings in ``jupyter/``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import re
import shutil
from typing import Any
from typing import Iterable

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

#: Modules whose ``__all__`` is the public API.
API_MODULES = (
  "stiefax",
  "stiefax.geometry",
  "stiefax.muon",
  "stiefax.layouts",
  "stiefax.labels",
  "stiefax.flax",
  "stiefax.diagnostics",
  "stiefax.certificates",
  "stiefax.covariance",
  "stiefax.elr",
  "stiefax.sphere",
)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)", re.MULTILINE)


def docstring_problems(obj: Any) -> list[str]:
  """What the docstring of one public symbol lacks (empty when complete).

  Functions need an example (``>>>``), ``Args:`` when they take parameters and
  ``Returns:``; classes (NamedTuples and dataclasses included) need an example or an
  ``Attributes:`` section. Modules, plain constants and type aliases (``typing``
  forms such as ``FramesLike``) are not checked here.
  """
  if inspect.ismodule(obj) or not callable(obj) or getattr(obj, "__module__", None) == "typing":
    return []
  doc = inspect.getdoc(obj) or ""
  if inspect.isclass(obj):
    if not doc.strip():
      return ["a docstring"]
    if ">>>" not in doc and "Attributes:" not in doc:
      return ["an example (>>>) or an Attributes: section"]
    return []
  problems = []
  if ">>>" not in doc:
    problems.append("an Example (>>>)")
  try:
    params = inspect.signature(obj).parameters
  except (TypeError, ValueError):
    params = {}
  if params and "Args:" not in doc:
    problems.append("an Args: section")
  if "Returns:" not in doc and "Yields:" not in doc:
    problems.append("a Returns: section")
  return problems


def public_symbols(modules: Iterable[str] = API_MODULES) -> list[tuple[str, str, Any]]:
  """``(module, name, object)`` for every name in each module's ``__all__``."""
  out = []
  for module_name in modules:
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", ()):
      out.append((module_name, name, getattr(module, name)))
  return out


def undocumented(modules: Iterable[str] = API_MODULES) -> list[str]:
  """One line per public symbol whose docstring is incomplete."""
  return [
    f"{m}.{n}: the docstring lacks {', '.join(p)}"
    for m, n, obj in public_symbols(modules)
    if (p := docstring_problems(obj))
  ]


def unrendered(directives: Iterable[str], modules: Iterable[str] = API_MODULES) -> list[str]:
  """Public symbols that no ``::: name`` directive renders."""
  shown = set(directives)
  missing = []
  for m, n, obj in public_symbols(modules):
    if inspect.ismodule(obj):
      if obj.__name__ not in shown:
        missing.append(f"{m}.{n}: add '::: {obj.__name__}' to an API page")
    elif f"{m}.{n}" not in shown and (m == "stiefax" or m not in shown):
      missing.append(f"{m}.{n}: add '::: {m}.{n}' to an API page")
  return missing


def api_directives(docs_dir: pathlib.Path) -> list[str]:
  """The identifiers of every ``::: identifier`` line under ``docs_dir/api``."""
  found = []
  for page in sorted((docs_dir / "api").glob("*.md")):
    found += _DIRECTIVE.findall(page.read_text(encoding="utf-8"))
  return found


_CODE = re.compile(r"<(pre|code)\b[^>]*>.*?</\1>", re.DOTALL)
_RAW_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj|ref):(?:`|<code>)")
_RAW_LITERAL = re.compile(r"\S::\s*</p>|<p>::</p>")


def raw_markup(html: str) -> list[str]:
  """Sphinx markup left unrendered in a page: roles and ``::`` literal markers.

  Code (``<pre>``, ``<code>``) is ignored, so ``a::b`` in an example is fine.
  """
  text = _CODE.sub(lambda m: "<code></code>" if m.group(1) == "code" else "", html)
  found = []
  for pattern in (_RAW_ROLE, _RAW_LITERAL):
    for match in pattern.finditer(text):
      found.append(text[max(0, match.start() - 60) : match.end() + 20].replace("\n", " "))
  return found


# Code blocks and headings keep their text as written (headings feed the search
# index's titles); inline code elsewhere gets the break points of code_break_points.
_KEPT = re.compile(r"<pre\b.*?</pre>|<h([1-6])\b.*?</h\1>", re.DOTALL)
_INLINE_CODE = re.compile(r"(<code\b[^>]*>)(.*?)(</code>)", re.DOTALL)
_MARKUP = re.compile(r"(<[^>]+>|&[#\w]+;)")
# After a dot, a slash, an opening parenthesis, a comma or an equals sign that a name,
# a bracket or a quote follows.
_BREAK_AFTER = re.compile(r"(?<=[./(,=])(?=[A-Za-z_(\[\"'])")


def code_break_points(html: str) -> str:
  """``html`` with a ``<wbr>`` at each place inline code may wrap between its parts.

  The stylesheet (``docs/stylesheets/extra.css``) keeps inline code from breaking
  inside a word; a long name such as ``stiefax.layouts.qk_frames(head_dim=16)`` in a
  narrow table cell then wraps after a dot, slash, parenthesis, comma or equals sign
  (a ``<wbr>``: no character is added, copying the code gives it unchanged). Code
  blocks and headings are left as they are.
  """

  def code(match: re.Match) -> str:
    parts = _MARKUP.split(match.group(2))
    body = "".join(p if _MARKUP.fullmatch(p) else _BREAK_AFTER.sub("<wbr>", p) for p in parts)
    return match.group(1) + body + match.group(3)

  out, pos = [], 0
  for kept in _KEPT.finditer(html):
    out += [_INLINE_CODE.sub(code, html[pos : kept.start()]), kept.group(0)]
    pos = kept.end()
  out.append(_INLINE_CODE.sub(code, html[pos:]))
  return "".join(out)


def on_post_page(output, page, config):
  problems = raw_markup(output)
  if problems:
    raise PluginError(
      f"{page.file.src_uri}: unrendered Sphinx markup (write Markdown: [`name`][id]"
      " cross-references, and ':' before an indented code block):\n  " + "\n  ".join(problems[:10])
    )
  return code_break_points(output)


#: The page that shows the table of query/key layouts, and the comments around it.
LAYOUTS_PAGE = "howto/your-model.md"
LAYOUTS_BEGIN = (
  "<!-- The table of layouts, one row per stiefax.layouts.LAYOUTS row: the build renders"
  " it, python docs/hooks/stiefax_docs.py rewrites it here. -->"
)
LAYOUTS_END = "<!-- End of the table of layouts. -->"


def layouts_table(layouts: Iterable[Any] | None = None) -> str:
  """The Markdown table of the query/key layouts, one line per row of ``layouts``.

  ``layouts`` defaults to ``stiefax.layouts.LAYOUTS``.
  """
  if layouts is None:
    layouts = importlib.import_module("stiefax.layouts").LAYOUTS
  lines = [
    "| model code | path ends in | shape | frames | `qk_frames` needs |",
    "|---|---|---|---|---|",
  ]
  for row in layouts:
    needs = "nothing" if row.heads is None else f"`head_dim=...` or `{row.heads}=...`"
    lines.append(
      f"| {row.family} | `{row.module}/{row.param}` | `{row.shape}` | {row.frames} | {needs} |"
    )
  return "\n".join(lines) + "\n"


def with_layouts_table(markdown: str, layouts: Iterable[Any] | None = None) -> str:
  """``markdown`` with the table between :data:`LAYOUTS_BEGIN` and :data:`LAYOUTS_END`
  rendered afresh from ``layouts`` (see :func:`layouts_table`)."""
  begin, end = markdown.find(LAYOUTS_BEGIN), markdown.find(LAYOUTS_END)
  if begin < 0 or end < begin:
    raise PluginError(
      f"{LAYOUTS_PAGE}: the table of layouts must stand between the lines"
      f" {LAYOUTS_BEGIN!r} and {LAYOUTS_END!r}."
    )
  head = markdown[: begin + len(LAYOUTS_BEGIN)]
  return f"{head}\n\n{layouts_table(layouts)}\n{markdown[end:]}"


def on_page_markdown(markdown, page, config, files):
  if page.file.src_uri == LAYOUTS_PAGE:
    return with_layouts_table(markdown)
  return markdown


#: Jupyter configuration for the notebooks' execution: the kernels log errors only, so
#: the build log does not carry each kernel's warning that its local TCP sockets are
#: unencrypted (the notebooks' own output and errors are unaffected).
JUPYTER_CONFIG = pathlib.Path(__file__).resolve().parent / "jupyter"


def on_config(config):
  # Read by nbconvert when mkdocs-jupyter converts a notebook (jupyter_nbconvert_config).
  paths = [str(JUPYTER_CONFIG)] + [
    p for p in os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p
  ]
  os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(dict.fromkeys(paths))
  docs_dir = pathlib.Path(config["docs_dir"])
  problems = undocumented() + unrendered(api_directives(docs_dir))
  if problems:
    raise PluginError(
      "Undocumented public API (every symbol in the __all__ of "
      + ", ".join(API_MODULES)
      + " needs an example, Args and Returns, and an API"
      " page entry):\n  " + "\n  ".join(problems)
    )
  return config


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files, config):
  notebooks = _ROOT / "notebooks"
  for path in sorted(notebooks.glob("*.ipynb")):
    # src_dir is the repository root, so the file's source is notebooks/<name>.
    files.append(
      File(
        f"notebooks/{path.name}",
        src_dir=str(_ROOT),
        dest_dir=config["site_dir"],
        use_directory_urls=config["use_directory_urls"],
      )
    )
  return files


#: Where the built site serves MathJax (``extra_javascript`` in mkdocs.yml loads
#: ``MATHJAX_DIR/MATHJAX_ENTRY``).
MATHJAX_DIR = "javascripts/mathjax"
MATHJAX_ENTRY = "tex-mml-chtml.js"


def mathjax_source() -> pathlib.Path:
  """The MathJax 3 ``es5`` folder of the installed ``django-static-mathjax`` package."""
  try:
    package = importlib.import_module("mathjax")
  except ImportError as e:
    raise PluginError(
      "MathJax is served from the site and comes from the package django-static-mathjax"
      f" ({e}); install the docs extra: pip install -e '.[docs]'"
    ) from e
  source = pathlib.Path(package.__file__).parent / "static" / "mathjax" / "es5"
  if not (source / MATHJAX_ENTRY).is_file():
    raise PluginError(f"{source / MATHJAX_ENTRY} is missing: reinstall django-static-mathjax.")
  return source


def _other_bundles(folder: str, names: list[str]) -> list[str]:
  """The top-level combined bundles that the site does not load (the entry's parts stay)."""
  if pathlib.Path(folder).name != "es5":
    return []
  return [n for n in names if n.endswith(".js") and n != MATHJAX_ENTRY]


def on_post_build(config):
  target = pathlib.Path(config["site_dir"]) / MATHJAX_DIR
  if target.exists():
    shutil.rmtree(target)
  shutil.copytree(mathjax_source(), target, ignore=_other_bundles)


if __name__ == "__main__":
  # Rewrites the table of layouts in the Markdown source from stiefax.layouts.LAYOUTS.
  page = pathlib.Path(__file__).resolve().parents[1] / LAYOUTS_PAGE
  page.write_text(with_layouts_table(page.read_text(encoding="utf-8")), encoding="utf-8")
