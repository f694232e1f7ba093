"""The pages fit a 1280 px window with the table of contents shown.

At 1280 px Material shows both sidebars (navigation and table of contents, from
76.25em), and the content column leaves a code block 656 px for its text: the code
font is 0.85 x 0.8rem at a 20 px root (13.6 px), a monospace character is 0.6 em wide
(8.16 px; Roboto Mono and the offline fallback, DejaVu Sans Mono, alike), so a line
holds :data:`CODE_COLUMNS` = 80 characters. Chromium 150 measured the same: 8.18 px a
character, 656 px, 80 characters (the slow test below).

The fast tests check the sources: every code-block line of every page, and every line
of the docstring examples the API pages render, is at most 80 characters (the reports
the pages quote are printed in parts that fit: tests/columns.py), and the docs hook and
stylesheet keep inline code from breaking inside a word. The slow test builds the site
(notebooks not executed) and opens every page in headless Chromium at 1280 px: the
table of contents is shown, no code block or table is wider than its box, and no
inline code breaks between two word characters. It needs Chromium on PATH and fails,
saying how to install it, where there is none (.ci/run installs it).
"""

import html
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Characters a code-block line holds at 1280 px with both sidebars (module docstring).
CODE_COLUMNS = 80

_FENCE = re.compile(r"^\s*(```+|~~~+)")


def code_lines(text: str):
  """``(line number, line)`` of every line inside a fenced code block."""
  fence = None
  for number, line in enumerate(text.splitlines(), 1):
    m = _FENCE.match(line)
    if m and fence is None:
      fence = m.group(1)
    elif m and line.strip().startswith(fence):
      fence = None
    elif fence is not None:
      yield number, line


def pages() -> list[str]:
  """Every Markdown page of the site (sources, under docs/)."""
  return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def test_code_lines_fit_the_column_at_1280px():
  long = [
    f"{page}:{n}: {len(line)} characters"
    for page in pages()
    for n, line in code_lines((DOCS / page).read_text(encoding="utf-8"))
    if len(line) > CODE_COLUMNS
  ]
  assert long == [], long


def example_lines(doc: str):
  """Every line of the code blocks of a docstring as the API pages render them: the
  doctest sessions (from a ``>>>`` line to a blank line) and the literal blocks (the
  lines indented under a paragraph that ends in ``::``), each dedented."""
  lines = doc.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    indent = len(line) - len(line.lstrip())
    if line.lstrip().startswith(">>>"):
      while i < len(lines) and lines[i].strip():
        yield lines[i][indent:]
        i += 1
    elif line.rstrip().endswith("::"):
      i += 1
      block = []
      while i < len(lines) and (
        not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
      ):
        block.append(lines[i])
        i += 1
      body = [ln for ln in block if ln.strip()]
      inner = min((len(ln) - len(ln.lstrip()) for ln in body), default=0)
      yield from (ln[inner:] for ln in body)
    else:
      i += 1


def documented_objects():
  """``(name, object)`` of every symbol the API pages render, with the public members
  of its classes (their docstrings render under the class)."""
  import inspect  # pylint: disable=g-import-not-at-top

  hook = _hook()
  seen = set()
  for module_name, name, obj in hook.public_symbols():
    for label, o in [(f"{module_name}.{name}", obj)] + [
      (f"{module_name}.{name}.{m}", v)
      for m, v in (vars(obj).items() if inspect.isclass(obj) else ())
      if not m.startswith("_")
    ]:
      o = o.__func__ if isinstance(o, (staticmethod, classmethod)) else o
      o = o.fget if isinstance(o, property) else o
      if id(o) not in seen and (inspect.isclass(o) or callable(o) or inspect.ismodule(o)):
        seen.add(id(o))
        yield label, o
  for module_name in hook.API_MODULES:
    import importlib  # pylint: disable=g-import-not-at-top

    yield module_name, importlib.import_module(module_name)


#: Symbols whose docstring example still has a line wider than the column (it scrolls
#: in its box); the list only shrinks: a test fails on a symbol whose example fits.
#: (stiefax/_matrix.py is at the 500-line bound of tests/test_modules.py, and wrapping
#: its two examples would take it over.)
WIDE_EXAMPLES: tuple[str, ...] = ()


def _wide_examples() -> dict[str, list[str]]:
  """The docstring example lines wider than the column, by symbol."""
  import inspect  # pylint: disable=g-import-not-at-top

  wide: dict[str, list[str]] = {}
  for name, obj in documented_objects():
    for line in example_lines(inspect.getdoc(obj) or ""):
      if len(line) > CODE_COLUMNS:
        wide.setdefault(name, []).append(line)
  return wide


def test_docstring_examples_fit_the_column_at_1280px():
  wide = _wide_examples()
  long = [
    f"{name}: {len(line)} characters: {line}"
    for name, lines in wide.items()
    if name not in WIDE_EXAMPLES
    for line in lines
  ]
  assert long == [], "\n".join(long)
  fit = [name for name in WIDE_EXAMPLES if name not in wide]
  assert fit == [], f"these examples fit now: take them off WIDE_EXAMPLES: {fit}"


def test_example_lines_are_the_dedented_sessions_and_literal_blocks():
  doc = "Text >>> not a session.\n\nExample:\n  >>> x = (1,\n  ...      2)\n  x\n\nMore."
  assert list(example_lines(doc)) == [">>> x = (1,", "...      2)", "x"]
  doc = "The rule::\n\n    a = b   # c\n      d\n\n    e\n\nNot code.\n"
  assert list(example_lines(doc)) == ["a = b   # c", "  d", "e"]


def test_code_lines_sees_only_code():
  text = "a very long prose line " * 9 + "\n```python\nx = 1\n```\n~~~\ny\n~~~\n"
  assert list(code_lines(text)) == [(3, "x = 1"), (6, "y")]


def _hook():
  spec = importlib.util.spec_from_file_location(
    "stiefax_docs_hook", DOCS / "hooks" / "stiefax_docs.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_inline_code_breaks_only_between_the_parts_of_a_name():
  hook = _hook()
  page = (
    "<p><code>stiefax.layouts.qk_frames(head_dim=16)</code> and <code>a/b, c=d</code>"
    " and <code>0.1 &amp; x.y</code></p><h2 id='x'><code>stiefax.flax</code></h2>"
    "<pre><code>keep.this(line=as_is)</code></pre>"
  )
  out = hook.code_break_points(page)
  assert "<code>stiefax.<wbr>layouts.<wbr>qk_frames(<wbr>head_dim=16)</code>" in out
  assert "<code>a/<wbr>b, c=<wbr>d</code>" in out
  assert "<code>0.1 &amp; x.<wbr>y</code>" in out  # a number and an entity are kept
  assert "<h2 id='x'><code>stiefax.flax</code></h2>" in out  # headings feed the search
  assert "<pre><code>keep.this(line=as_is)</code></pre>" in out
  assert re.sub("<wbr>", "", out) == page  # no character added


def test_the_stylesheet_keeps_words_whole():
  css = (DOCS / "stylesheets" / "extra.css").read_text()
  rule = css[css.index(".md-typeset code {") :].split("}", 1)[0]
  assert "word-break: keep-all" in rule and "overflow-wrap: normal" in rule
  assert "  - stylesheets/extra.css" in (ROOT / "mkdocs.yml").read_text()


# The probe each page runs in Chromium: it writes what it measured into the DOM, which
# ``--dump-dom`` prints.
_PROBE = r"""
(function () {
  function run() {
    const out = {toc: null, overflow: [], tables: [], broken: [], chars: null};
    const toc = document.querySelector('.md-sidebar--secondary');
    if (toc) {
      const r = toc.getBoundingClientRect();
      out.toc = getComputedStyle(toc).display !== 'none' && r.width > 0
        && r.left < window.innerWidth;
    }
    const content = '.md-content ';
    for (const el of document.querySelectorAll(content + 'pre > code')) {
      if (el.scrollWidth > el.clientWidth + 1) {
        out.overflow.push(el.textContent);
      }
    }
    for (const el of document.querySelectorAll(
        content + '.md-typeset__scrollwrap, ' + content + 'table')) {
      if (el.scrollWidth > el.clientWidth + 1) {
        out.tables.push(el.textContent.trim().split('\n')[0].slice(0, 80));
      }
    }
    for (const code of document.querySelectorAll(content + 'code')) {
      if (code.closest('pre') || code.getClientRects().length < 2) continue;
      const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
      let prev = null, node;
      while ((node = walker.nextNode())) {
        for (let i = 0; i < node.length; i++) {
          const range = document.createRange();
          range.setStart(node, i);
          range.setEnd(node, i + 1);
          const rect = range.getClientRects()[0];
          if (!rect) continue;
          const ch = node.data[i];
          if (prev && rect.top > prev.top + 2 && /\w/.test(prev.ch) && /\w/.test(ch)) {
            out.broken.push(code.textContent.slice(0, 80));
          }
          prev = {ch: ch, top: rect.top};
        }
      }
    }
    const block = document.querySelector(content + 'pre > code');
    if (block) {
      const probe = document.createElement('span');
      probe.textContent = 'x'.repeat(100);
      block.appendChild(probe);
      const width = probe.getBoundingClientRect().width / 100;
      block.removeChild(probe);
      const cs = getComputedStyle(block);
      const inner = block.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      out.chars = Math.floor(inner / width);
    }
    const pre = document.createElement('pre');
    pre.id = 'layout-probe';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  // After the math is typeset and the fonts are loaded: both change the widths.
  window.addEventListener('load', function () {
    const math = window.MathJax && MathJax.startup && MathJax.startup.promise;
    Promise.all([math || Promise.resolve(), document.fonts.ready]).then(function () {
      setTimeout(run, 300);
    });
  });
})();
"""


def _chromium():
  for name in ("chromium", "chromium-browser", "google-chrome", "headless_shell"):
    path = shutil.which(name)
    if path:
      return path
  return None


def measure(browser: str, page: pathlib.Path) -> dict:
  """What the probe measures on a built page in a 1280 x 1000 window."""
  probe = page.with_name("_layout_probe.html")
  probe.write_text(page.read_text().replace("</body>", f"<script>{_PROBE}</script></body>"))
  try:
    proc = subprocess.run(
      [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
      + ["--window-size=1280,1000", "--virtual-time-budget=8000", "--dump-dom"]
      + [probe.as_uri()],
      capture_output=True,
      text=True,
      timeout=120,
    )
  finally:
    probe.unlink()
  found = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.DOTALL)
  assert found, f"{page}: no measurement ({proc.stderr[-500:]})"
  return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow  # builds the site and opens each page in Chromium: a few minutes
@pytest.mark.timeout(900)
def test_pages_fit_1280px_with_the_table_of_contents(tmp_path):
  import yaml  # pylint: disable=g-import-not-at-top

  browser = _chromium()
  assert browser is not None, (
    "no Chromium on PATH: the layout check needs it (apt-get install chromium)"
  )
  config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
  for plugin in config["plugins"]:
    if isinstance(plugin, dict) and "mkdocs-jupyter" in plugin:
      plugin["mkdocs-jupyter"]["execute"] = False  # the layout, not the outputs
  site = tmp_path / "site"
  config.update(site_dir=str(site), strict=False)
  # Next to mkdocs.yml, so that its relative paths (hooks, docs) hold.
  path = ROOT / f".layout-check-{os.getpid()}.yml"
  path.write_text(yaml.safe_dump(config))
  try:
    env = dict(os.environ, JAX_PLATFORMS="cpu", NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(path)],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
    )
  finally:
    path.unlink()
  assert proc.returncode == 0, proc.stderr[-4000:]
  built = sorted(p for p in site.rglob("*.html") if p.name == "index.html")
  sources = pages() + [f"notebooks/{p.stem}.ipynb" for p in (ROOT / "notebooks").glob("*.ipynb")]
  assert len(built) == len(sources), (len(built), sources)
  known = {
    line for name, lines in _wide_examples().items() if name in WIDE_EXAMPLES for line in lines
  }
  problems = []
  for page in built:
    name = str(page.relative_to(site))
    got = measure(browser, page)
    if got["toc"] is False:
      problems.append(f"{name}: the table of contents is hidden")
    if got["chars"] is not None and got["chars"] != CODE_COLUMNS:
      problems.append(f"{name}: a code line holds {got['chars']} characters")
    for text in got["overflow"]:
      wide = [line for line in text.splitlines() if len(line) > CODE_COLUMNS]
      if not wide or not set(wide) <= known:  # known: the WIDE_EXAMPLES lines
        problems.append(f"{name}: code block scrolls: {text.strip().splitlines()[0][:80]}")
    problems += [f"{name}: table scrolls: {t}" for t in got["tables"]]
    problems += [f"{name}: breaks inside a word: {t}" for t in got["broken"]]
  assert problems == [], "\n".join(problems)


def test_fit_prints_a_wide_table_in_parts_that_keep_every_cell():
  from tests import columns  # pylint: disable=g-import-not-at-top

  names = ["arm", "seeds"] + [f"metric {k} (pp)" for k in range(8)]
  rows = [["A2", "12"] + [f"+{k}.{k}{k} ± 0.{k}" for k in range(8)]]
  rows.append(["B2-frozen", "6"] + [f"-{k}.0{k}" for k in range(8)])
  widths = [max(len(r[j]) for r in [names, *rows]) for j in range(len(names))]
  line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
  note = "  " + " ".join(f"word{k}" for k in range(30))
  text = "\n".join([line(names), line(["-" * w for w in widths])] + [line(r) for r in rows])
  out = columns.fit(text + "\n" + note).splitlines()
  assert len(line(names)) > columns.WIDTH and all(len(ln) <= columns.WIDTH for ln in out)
  parts = [p.splitlines() for p in "\n".join(out).split("\n\n")]
  assert len(parts) >= 2
  for part in parts:
    assert part[0].startswith("arm ") and set(part[1]) <= {"-", " "}
    assert part[2].startswith("A2 ") and part[3].startswith("B2-frozen ")
  for r, row in enumerate([names, *rows]):
    got = "  ".join(part[0 if r == 0 else r + 1] for part in parts)
    assert all(cell in got for cell in row)  # every cell, whole
  wrapped = [ln for ln in out if ln.lstrip().startswith("word")]
  assert " ".join(" ".join(wrapped).split()) == note.strip()
  assert columns.fit("short\nlines") == "short\nlines"
