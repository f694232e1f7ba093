"""The table of query/key layouts: one ``Layout`` row per layout, read by everything.

A layout is one row of ``LAYOUTS`` (``stiefax/_layout_table.py``) with its
``frame_spec`` builder: a row registered here (and nowhere else) is labelled, given
its frames, projected, trained and warned about like the built-in ones. The table on
the docs page and the table in the docstring of ``qk_frames`` agree with the rows.
"""

import importlib.util
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec
from stiefax import _layout_table
from stiefax.layouts import LAYOUTS
from stiefax.layouts import Layout

ROOT = pathlib.Path(__file__).resolve().parents[1]
D, H, K, R = 16, 4, 2, 4  # d_model, query heads, key/value heads, head_dim


def _hook():
  spec = importlib.util.spec_from_file_location(
    "stiefax_docs_hook", ROOT / "docs" / "hooks" / "stiefax_docs.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_row_has_a_unique_path_and_builds_a_frame_spec():
  ends = [(row.module, row.param) for row in LAYOUTS]
  assert len(set(ends)) == len(ends)
  for row in LAYOUTS:
    assert row.heads in (None, "num_heads", "num_kv_heads"), row
    spec = row.frame_spec(None if row.heads is None else (H, -1))
    assert isinstance(spec, FrameSpec)
    assert row.partial == (spec.select is not None)
  assert {(r.module, r.param) for r in LAYOUTS if r.partial} == {
    ("kv_einsum", "w"),
    ("qkv_einsum", "w"),
    ("c_attn", "kernel"),
  }


def test_the_docs_table_of_layouts_is_rendered_from_the_rows():
  hook = _hook()
  page = ROOT / "docs" / hook.LAYOUTS_PAGE
  text = page.read_text(encoding="utf-8")
  assert hook.with_layouts_table(text) == text, (
    f"{hook.LAYOUTS_PAGE} lists other layouts than stiefax.layouts.LAYOUTS; rewrite its"
    " table with: python docs/hooks/stiefax_docs.py"
  )
  table = hook.layouts_table()
  assert len(table.splitlines()) == 2 + len(LAYOUTS)
  for row in LAYOUTS:
    assert f"| `{row.module}/{row.param}` | `{row.shape}` |" in table


def test_the_docs_table_needs_its_markers():
  hook = _hook()
  with pytest.raises(Exception, match="must stand between"):
    hook.with_layouts_table("# A page without the table\n")


def test_the_qk_frames_docstring_gives_each_rows_frame_spec():
  """Each line of the table in the docstring of ``qk_frames`` is the builder's output."""
  doc = stiefax.layouts.qk_frames.__doc__
  documented = set()
  counts = {"num_heads": H, "num_kv_heads": K}
  for line in doc.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 3 or not cells[2].startswith("``FrameSpec("):
      continue
    spec = eval(cells[2].strip("`"), {"FrameSpec": FrameSpec, "H": H, "K": K})
    for end in re.findall(r"``(\w+)/(\w+)``", cells[0]):
      row = stiefax.layouts.layout_of(end)
      assert row is not None, end
      heads = None if row.heads is None else (counts[row.heads], -1)
      assert row.frame_spec(heads) == spec, (end, spec)
      documented.add(end)
  assert documented == {(row.module, row.param) for row in LAYOUTS}


# A layout that stiefax does not know, registered for one test: a fused query/key
# einsum weight (d_model, 2, heads, head_dim) whose query slice [0] is frames and whose
# key slice [1] is not, and a Dense query projection (d_model, heads * head_dim).
FUSED = Layout(
  "wqk",
  "kernel",
  "a fused query/key einsum",
  "(d_model, 2, heads, head_dim)",
  4,
  "the q slice [0]; k [1] is not",
  lambda heads: FrameSpec(select=(1, (0,))),
)
DENSE = Layout(
  "wq",
  "kernel",
  "a Dense query projection",
  "(d_model, heads * head_dim)",
  2,
  "every head",
  lambda heads: FrameSpec(split=(1, heads)),
  "num_heads",
)


@pytest.fixture
def registered(monkeypatch):
  monkeypatch.setattr(_layout_table, "LAYOUTS", _layout_table.LAYOUTS + (FUSED, DENSE))


def _model(rng):
  n = lambda *s: jnp.asarray(0.3 * rng.standard_normal(s), jnp.float32)
  return {
    "attn": {
      "wqk": {"kernel": n(D, 2, H, R)},
      "wq": {"kernel": n(D, H * R)},
      "out": {"kernel": n(H * R, D)},
    }
  }


def _iso(frames):
  frames = np.asarray(frames, np.float64)
  gram = np.swapaxes(frames, -1, -2) @ frames
  return float(np.max(np.abs(gram - np.eye(frames.shape[-1]))))


def _heads(params):
  """The query heads of both weights, ``(heads, d, r)``, and the key slice of wqk."""
  a = params["attn"]
  fused = np.asarray(a["wqk"]["kernel"]).transpose(1, 2, 0, 3)  # (2, H, D, R)
  dense = np.asarray(a["wq"]["kernel"]).reshape(D, H, R).transpose(1, 0, 2)
  return np.concatenate([fused[0], dense]), fused[1]


def test_a_new_row_is_all_a_new_layout_needs(registered, rng):
  params = _model(rng)
  path = lambda m: (
    jax.tree_util.DictKey("attn"),
    jax.tree_util.DictKey(m),
    jax.tree_util.DictKey("kernel"),
  )

  # Labels, frames, fused-or-not: read from the row.
  labels = stiefax.layouts.qk_labels(params)
  assert labels == {
    "attn": {"wqk": {"kernel": "stiefel"}, "wq": {"kernel": "stiefel"}, "out": {"kernel": "adamw"}}
  }
  assert stiefax.layouts.layout_of(("attn", "wqk", "kernel")).partial
  assert stiefax.layouts.qk_frames()(path("wqk"), params["attn"]["wqk"]["kernel"]) == FrameSpec(
    select=(1, (0,))
  )
  frames = stiefax.layouts.qk_frames(head_dim=R)
  assert frames(path("wq"), params["attn"]["wq"]["kernel"]) == FrameSpec(split=(1, (-1, R)))
  assert stiefax.layouts.qk_frames(num_heads=H)(path("wq"), params["attn"]["wq"]["kernel"]) == (
    FrameSpec(split=(1, (H, -1)))
  )

  # Its head count is never guessed: one line naming the parameter and the argument.
  with pytest.raises(ValueError) as raised:
    stiefax.flax.project_params(params)
  message = str(raised.value)
  assert "\n" not in message
  assert "attn/wq/kernel" in message and "num_heads=..." in message
  assert "a Dense query projection" in message

  # A name with another rank is refused in one line.
  with pytest.raises(ValueError, match=r"attn/wqk/kernel is named like a weight of a fused"):
    stiefax.layouts.qk_frames()(path("wqk"), jnp.zeros((D, 2 * H * R)))

  # Projected: the query heads orthonormal, the key slice and the rest bit for bit kept.
  snapped = stiefax.flax.project_params(params, frames=frames)
  heads, k = _heads(snapped)
  assert _iso(_heads(params)[0]) > 0.1 and _iso(heads) < 1e-5
  np.testing.assert_array_equal(k, _heads(params)[1])
  np.testing.assert_array_equal(snapped["attn"]["out"]["kernel"], params["attn"]["out"]["kernel"])

  # Trained: the query heads stay on the manifold, the key slice trains with AdamW.
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05, frames=frames)
  state, p = tx.init(snapped), snapped
  for i in range(5):
    g = jax.tree.map(lambda x, i=i: jax.random.normal(jax.random.key(i), x.shape), p)
    u, state = tx.update(g, state, p)
    p = optax.apply_updates(p, u)
  heads, k = _heads(p)
  assert _iso(heads) < 1e-5
  assert np.max(np.abs(k - _heads(snapped)[1])) > 0.01
  assert float(stiefax.diagnostics.isometry_error(p, stiefax.layouts.qk_labels, frames)) < 1e-5

  # An explicit FrameSpec() on its Dense kernel draws the one-line warning.
  with pytest.warns(UserWarning, match=r"attn/wq/kernel .*a Dense query projection"):
    stiefax.flax.project_params({"attn": {"wq": params["attn"]["wq"]}}, frames=FrameSpec())


def test_a_new_fused_row_trains_with_no_arguments(registered, rng):
  """``frames=None`` reads the fused row: its key slice gets AdamW moments of its shape."""
  params = {"attn": {"wqk": _model(rng)["attn"]["wqk"]}}
  snapped = stiefax.flax.project_params(params)
  tx = stiefax.stiefel_adamw(1e-2)
  state = tx.init(snapped)
  rest = state.inner_states["stiefel"].inner_state.rest
  assert [x.shape for x in jax.tree.leaves(rest[0].mu)] == [(D, 1, H, R)]
  u, state = tx.update(jax.tree.map(jnp.ones_like, snapped), state, snapped)
  heads = np.asarray(optax.apply_updates(snapped, u)["attn"]["wqk"]["kernel"])[:, 0]
  assert _iso(heads.transpose(1, 0, 2)) < 1e-5


def test_the_docs_table_shows_a_new_row(registered):
  table = _hook().layouts_table(_layout_table.LAYOUTS)
  assert (
    "| a Dense query projection | `wq/kernel` | `(d_model, heads * head_dim)` | every head |"
    " `head_dim=...` or `num_heads=...` |"
  ) in table
