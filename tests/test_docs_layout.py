"""The pages fit a 1280 px window with the table of contents shown.

At 1280 px Material shows both sidebars (navigation and table of contents, from
76.25em), and the content column leaves a code block 656 px for its text: the code
font is 0.85 x 0.8rem at a 20 px root (13.6 px), a monospace character is 0.6 em wide
(8.16 px; Roboto Mono and the offline fallback, DejaVu Sans Mono, alike), so a line
holds :data:`CODE_COLUMNS` = 80 characters. Chromium 150 measured the same: 8.18 px a
character, 656 px, 80 characters (the slow test below).

The fast tests check the Markdown: every code-block line of the pages in
:data:`FITTING` and :data:`CODE_FITS` is at most 80 characters, and the docs hook and
stylesheet keep inline code from breaking inside a word. The slow test builds the site
(notebooks not executed) and opens the pages in headless Chromium at 1280 px: the
table of contents is shown, no code block (nor, on the :data:`FITTING` pages, any
table) is wider than its box, and no inline code breaks between two word characters.

Pages left out, and why: the report tables quoted verbatim from ``stiefax report``
(reproduction, performance, covariance, and lm, which hides its table of contents for
them) are wider than the column and scroll; the API pages' examples are the
docstrings', up to the library's line length (100); the notebooks are laid out by
mkdocs-jupyter.
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

#: Pages whose code blocks and tables all fit the column (sources, under docs/).
FITTING = (
  "index.md",
  "getting-started.md",
  "concepts.md",
  "howto/arms.md",
  "howto/custom-frames.md",
  "howto/recipes.md",
  "howto/scaling.md",
  "howto/sharding.md",
  "howto/your-model.md",
  "api/index.md",
)

#: Pages whose code blocks fit; their wide tables scroll inside their wrappers.
CODE_FITS = ("optimizers.md",)

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


def test_code_lines_fit_the_column_at_1280px():
  long = [
    f"{page}:{n}: {len(line)} characters"
    for page in FITTING + CODE_FITS
    for n, line in code_lines((DOCS / page).read_text(encoding="utf-8"))
    if len(line) > CODE_COLUMNS
  ]
  assert long == [], long


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
        out.overflow.push(el.textContent.trim().split('\n')[0].slice(0, 80));
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
  window.addEventListener('load', function () { setTimeout(run, 300); });
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


def _built_page(site: pathlib.Path, source: str) -> pathlib.Path:
  stem = source.removesuffix(".md")
  if stem == "index":
    return site / "index.html"
  return site / stem.removesuffix("/index") / "index.html"


@pytest.mark.slow  # builds the site and opens each page in Chromium: a few minutes
@pytest.mark.timeout(900)
def test_pages_fit_1280px_with_the_table_of_contents(tmp_path):
  import yaml  # pylint: disable=g-import-not-at-top

  browser = _chromium()
  if browser is None:
    pytest.skip("no Chromium on this machine (apt-get install chromium)")
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
  problems = []
  for source in FITTING + CODE_FITS:
    got = measure(browser, _built_page(site, source))
    if got["toc"] is False:
      problems.append(f"{source}: the table of contents is hidden")
    if got["chars"] is not None and got["chars"] != CODE_COLUMNS:
      problems.append(f"{source}: a code line holds {got['chars']} characters")
    problems += [f"{source}: code block scrolls: {t}" for t in got["overflow"]]
    problems += [f"{source}: breaks inside a word: {t}" for t in got["broken"]]
    if source in FITTING:
      problems += [f"{source}: table scrolls: {t}" for t in got["tables"]]
  assert problems == [], "\n".join(problems)
