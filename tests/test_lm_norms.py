"""Study 3 of docs/lm.md: the bracketed grids, the larger model's arms and the report."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import NamedTuple

import numpy as np
import pytest

from stiefax.experiments import arms
from stiefax.experiments import report as report_lib
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.lm import data
from stiefax.experiments.lm import grid as lm_grid
from stiefax.experiments.lm import norms
from stiefax.experiments.lm import norms_tables
from stiefax.experiments.lm import runs as lm_runs
from stiefax.experiments.lm import tables
from stiefax.experiments.store import write_json
from tests import columns
from tests import harness


def _runs(rates, loss, seeds=norms.SELECTION_SEEDS, arm="AdamH"):
  field = norms.swept(arm)
  return [
    {"arm": arm, "seed": s, "config": {field: x}, "metrics": _metrics(loss(x, s))}
    for x in rates
    for s in seeds
  ]


def _metrics(val):
  return {"val_bpb": val, "init_val_bpb": 8.0, "diverged": False}


def _bowl(target):
  return lambda x, s: 1.8 + 0.01 * abs(math.log(x / target)) + 0.001 * s


def test_a_grid_is_open_until_every_rate_has_both_selection_seeds():
  begin = norms.start("AdamH", norms.SMALL_PRESET)
  runs = _runs(begin, _bowl(1e-2))[:-1]  # the last rate lacks seed 1
  assert norms.bracket(runs, begin) == (list(begin), False)
  assert norms.best(runs, begin) is None


def test_an_interior_best_ends_the_grid_where_it_began():
  begin = norms.start("AdamH", norms.SMALL_PRESET)  # 3e-3, 1e-2, 3e-2
  runs = _runs(begin, _bowl(1e-2))
  assert norms.bracket(runs, begin) == ([3e-3, 1e-2, 3e-2], True)
  assert norms.best(runs, begin) == (1e-2, False)


def test_an_edge_best_adds_the_rate_x3_beyond_it_until_the_best_is_inside():
  begin = norms.start("AdamH", norms.SMALL_PRESET)
  loss = _bowl(1e-3)  # the best lies below the starting grid
  rates, done = norms.bracket(_runs(begin, loss), begin)
  assert (rates, done) == ([1e-3, 3e-3, 1e-2, 3e-2], False)  # 1e-3 has no runs yet
  runs = _runs(rates, loss)
  rates, done = norms.bracket(runs, begin)
  assert (rates, done) == ([0.000333333, 1e-3, 3e-3, 1e-2, 3e-2], False)  # 1e-3 is the edge
  runs = _runs(rates, loss)
  assert norms.bracket(runs, begin) == ([0.000333333, 1e-3, 3e-3, 1e-2, 3e-2], True)
  assert norms.best(runs, begin) == (1e-3, False)


def test_an_edge_best_stops_after_the_limit_and_says_so():
  begin = norms.start("AdamH", norms.SMALL_PRESET)
  loss = _bowl(1e-9)  # far below: every extension still ends at the low edge
  rates = list(begin)
  for _ in range(norms.MAX_EXTENSIONS + 2):
    rates = norms.bracket(_runs(rates, loss), begin)[0]
  runs = _runs(rates, loss)
  assert len(rates) == len(begin) + norms.MAX_EXTENSIONS
  assert norms.bracket(runs, begin)[1] is True
  assert norms.best(runs, begin) == (rates[0], True)


def test_the_larger_grid_starts_at_the_small_best_and_x3_either_side():
  assert norms.start("MuonH", norms.LARGE_PRESET, 0.01) == (0.00333333, 0.01, 0.03)
  with pytest.raises(ValueError, match="small model's best"):
    norms.start("MuonH", norms.LARGE_PRESET)


def test_each_arm_sweeps_one_rate_and_fixes_the_others():
  assert norms.swept("A2") == "adamw_lr" and norms.swept("B2") == "frame_lr"
  assert norms.fixed("B2", 0.01) == {"adamw_lr": norms.B2_ADAMW_LR, "matrix_lr": 0.01}
  assert norms.fixed("B2-H", 0.01) == {"adamw_lr": norms.REST_LR, "frame_lr": norms.B2H_FRAME_LR}
  assert norms.fixed("AdamH", 0.01) == {"adamw_lr": norms.REST_LR, "frame_lr": 1.0}
  with pytest.raises(ValueError, match="not an arm of study 3"):
    norms.swept("B2-fold")


# A synthetic study 3: each arm's loss is a bowl in log-rate around its target rate,
# with its own offset; the larger model's targets are x3 lower for the Adam-based
# matrix rules (their best moves one step), the same elsewhere.
_SMALL_TARGET = {
  "A2": 5.5e-3,
  "A2-qknorm": 1e-2,
  "B2": 0.1,
  "AdamH": 1e-2,
  "AdamH-qknorm": 1e-2,
  "Muon": 1e-2,
  "MuonH": 3e-2,
  "B2-H": 1e-2,
  "SphereAdam": 0.1,
}
_OFFSET = {"A2": 0.0, "A2-qknorm": -0.03, "AdamH": -0.035, "MuonH": -0.04, "AdamH-qknorm": -0.034}


def _record(arm, preset, rate, seed, val):
  cfg = lm_config.PRESETS[preset]
  settings = {**norms.fixed(arm, cfg.matrix_lr), norms.swept(arm): rate}
  c = dataclasses.replace(cfg, **settings)
  rc = lm_runs.run_config(arms.ARMS[arm], c, data.load().facts, preset)
  return harness.complete_lm_record(
    {
      "experiment": "lm",
      "arm": arm,
      "seed": seed,
      "config": rc,
      "wall_time": 300.0,
      "metrics": {
        "val_bpb": val,
        "test_bpb": val + 0.01,
        "init_val_bpb": 8.0,
        "diverged": False,
        "max_logit_max": 20.0,
        "entropy": 1.5,
        "isometry": 1e-7,
      },
    }
  )


def _target(arm, preset):
  t = _SMALL_TARGET[arm]
  return t / 3 if preset == norms.LARGE_PRESET and arm in ("AdamH", "AdamH-qknorm") else t


def _fill(tmp_path, preset, arm_names, rng):
  """Runs each arm's grid (seeds 0-1) until final, then seeds 2-5 at its best."""
  out = {}
  for arm in arm_names:
    t = _target(arm, preset)
    noise = {s: 0.002 * rng.standard_normal() for s in range(6)}

    def val(x, s, arm=arm, t=t, noise=noise):
      return 1.8 + _OFFSET.get(arm, 0.02) + 0.02 * abs(math.log(x / t)) + noise[s]

    if preset == norms.LARGE_PRESET:
      begin = norms.start(arm, preset, _SMALL_TARGET[arm])
    else:
      begin = norms.start(arm, preset)
    runs: list = []
    while True:
      rates, done = norms.bracket(runs, begin)
      if done:
        break
      have = {(norms.cell_of(r), r["seed"]) for r in runs}
      for x in rates:
        for s in norms.SELECTION_SEEDS:
          if (x, s) not in have:
            runs.append(_record(arm, preset, x, s, val(x, s)))
    best = norms.best(runs, begin)[0]
    runs += [_record(arm, preset, best, s, val(best, s)) for s in range(2, 6)]
    for r in runs:
      write_json(tmp_path / lm_runs.run_name(arm, r["config"], r["seed"]), r)
    out[arm] = best
  return out


@pytest.fixture(scope="module")
def study3(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("lm-norms")
  rng = np.random.default_rng(0)
  small = _fill(tmp_path, norms.SMALL_PRESET, norms.ARMS, rng)
  return tmp_path, small, rng


def test_the_larger_model_runs_a2_a2_qknorm_and_the_arms_near_the_best(study3):
  folder, small, _ = study3
  assert small == {a: pytest.approx(t) for a, t in _SMALL_TARGET.items()}
  # MuonH is best (-0.04); AdamH (-0.035) and AdamH-qknorm (-0.034) are within 0.01.
  names = lm_grid.norms_large_arms(folder, data.load().facts)
  assert names == ["A2", "A2-qknorm", "AdamH", "AdamH-qknorm", "MuonH"]
  begin = lm_grid.norms_begin("MuonH", norms.LARGE_PRESET, folder, folder, data.load().facts)
  assert begin == (0.01, 0.03, 0.09)


def test_the_report_of_a_whole_study_three(study3, tmp_path):
  folder, _, rng = study3
  import shutil

  shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
  large_arms = ["A2", "A2-qknorm", "AdamH", "AdamH-qknorm", "MuonH"]
  large = _fill(tmp_path, norms.LARGE_PRESET, large_arms, rng)
  groups, warnings = report_lib.load_runs(tmp_path)
  assert warnings == []
  assert norms_tables.is_study3(groups["lm"])
  by_model = norms_tables.grids(groups["lm"])
  assert {a: g.best for a, g in by_model["large"].items()} == large
  assert not any(g.at_edge for m in by_model.values() for g in m.values())
  text = tables.report(groups["lm"], tmp_path / "plots")
  small_part, large_part = text.split("study 3, the larger model")
  grid = small_part.split("each arm's grid")[1].split("\n\n")[0]
  rows: dict[str, str] = {}  # each arm's row, its continuation lines joined to it
  arm = ""
  for ln in grid.splitlines()[5:]:
    arm = arm if ln.startswith(" ") else ln.split()[0]
    rows[arm] = rows.get(arm, "") + ln
  assert "0.01*: " in rows["AdamH"] and rows["AdamH"].split()[1:3] == ["matrix", "inside"]
  assert "0.03*: " in rows["MuonH"] and "0.09: " in rows["MuonH"]  # extended once above
  budget = small_part.split("tuning budget")[1].split("\n\n")[0]
  row = {ln.split()[0]: ln.split() for ln in budget.splitlines()[3:]}
  assert row["MuonH"][1:5] == ["4", "0.003-0.09", "0", "/"] and row["MuonH"][5] == "1"
  # 4 rates x 2 seeds + 4 seeds at the best, 300 s each.
  assert row["MuonH"][6:] == ["8", "12", f"{12 * 300 / 3600:.2f}"]
  against = small_part.split("against A2:")[1].split("\n\n")[0]
  verdicts = {ln.split()[0]: ln for ln in against.splitlines()[3:]}
  assert "(6)" in verdicts["MuonH"] and verdicts["MuonH"].endswith("better")
  # The transfer: AdamH's best moved one x3 step down, MuonH's stayed.
  transfer = large_part.split("transfer:")[1].split("\n\n")[0]
  moved = {ln.split()[0]: ln.split() for ln in transfer.splitlines()[4:]}
  assert moved["AdamH"][1:4] == ["0.01", "0.00333", "-1"]
  assert moved["MuonH"][3] == "+0" and moved["MuonH"][-1] == "+0.0000"
  gap = float(moved["AdamH"][-1])
  assert gap == pytest.approx(0.02 * math.log(3), abs=0.006)  # one step up the bowl
  assert (tmp_path / "plots" / "lm_norms_rates.png").stat().st_size > 0
  assert (tmp_path / "plots" / "lm_norms_large_best_curves.png").stat().st_size > 0


def test_an_open_grid_is_reported_as_open_and_other_settings_are_left_out(tmp_path):
  for s in norms.SELECTION_SEEDS:
    rec = _record("AdamH", norms.SMALL_PRESET, 1e-2, s, 1.8)
    write_json(tmp_path / lm_runs.run_name("AdamH", rec["config"], s), rec)
  other = _record("AdamH", norms.SMALL_PRESET, 3e-2, 0, 1.7)
  other["config"]["adamw_lr"] = 1e-3  # not study 3's rest rate: another setting
  write_json(tmp_path / "other.json", other)
  groups, _ = report_lib.load_runs(tmp_path)
  text = tables.report(groups["lm"], None)
  grid = text.split("each arm's grid")[1].split("\n\n")[0]
  (row,) = [ln for ln in grid.splitlines() if ln.startswith("AdamH ")]
  assert row.split()[1:3] == ["matrix", "open"] and row.endswith("0.003: -; 0.01: 1.800; 0.03: -")
  assert "at its best rate" not in text


class _Committed(NamedTuple):
  """Study 3's committed runs, read once for the tests of the pages."""

  root: pathlib.Path
  runs: list  # results/lm-norms
  text: str  # their report, as `stiefax report` prints it
  grids: dict  # norms_tables.grids of the runs


@pytest.fixture(scope="module")
def committed() -> _Committed:
  root = pathlib.Path(__file__).resolve().parents[1]
  groups, _ = report_lib.load_runs(root / "results" / "lm-norms")
  runs = groups["lm"]
  text = "\n".join(norms_tables.report(runs, None))
  return _Committed(root, runs, text, norms_tables.grids(runs))


def test_study_twos_open_edge_is_closed_by_study_threes_run_below_it(committed):
  """docs/lm.md, study 2's decisions: B2's frame rate 0.03 (study 3) against 0.1."""
  root = committed.root
  b2 = committed.grids["sweep"]["B2"]
  low, best = b2.mean(0.03), b2.mean(0.1)
  assert low is not None and best is not None and low > best
  doc = (root / "docs" / "lm.md").read_text(encoding="utf-8")
  assert f"0.03, at seeds 0-1: {low:.4f}, above 0.1's\n  {best:.4f}" in doc


def _section(lines: list[str], start: str, stop: str | None) -> str:
  """The lines from the first that starts with ``start`` to the next that starts with
  ``stop`` (``None``: to the end)."""
  i = next(k for k, line in enumerate(lines) if line.strip().startswith(start))
  ends = (k for k, line in enumerate(lines) if k > i and stop and line.strip().startswith(stop))
  return "\n".join(lines[i : next(ends, len(lines))]).rstrip()


def test_the_small_models_grids_on_the_page_are_the_runs(committed):
  """docs/lm.md, study 3's small-model grids: the quoted tables and every number of the
  words under them, from results/lm-norms."""
  root = committed.root
  folder = root / "results" / "lm-norms"
  lines = committed.text.splitlines()
  doc = (root / "docs" / "lm.md").read_text(encoding="utf-8")
  page = doc.split("### The small model's grids")[1].split("\n### ")[0]
  for start, stop in (("each arm's grid", "tuning budget"), ("learning-rate", "each arm at")):
    quoted = columns.fit(_section(lines, start, stop))
    assert f"```\n{quoted}\n```" in page, quoted
  words = " ".join(page.split("```")[-1].split())
  small = committed.grids[norms.SMALL_PRESET]
  assert all(g.final and not g.at_edge for g in small.values())
  best = {arm: g.mean(g.best) for arm, g in small.items()}
  muon, qk, a2 = best["Muon"], best["A2-qknorm"], best["A2"]
  assert muon == min(best.values())
  assert f"Muon's best cell (matrix rate {small['Muon'].best:g}: {muon:.3f})" in words
  assert f"{qk - muon:.3f} below A2-qknorm's best ({small['A2-qknorm'].best:g}: {qk:.3f})" in words
  assert f"{a2 - muon:.3f} below A2's ({small['A2'].best:g}: {a2:.3f})" in words
  below = [arm for arm in best if arm not in ("Muon", "A2-qknorm") and best[arm] < qk]
  assert below == ["MuonH"] and f"MuonH's best ({best['MuonH']:.3f}) is the only other" in words
  rest = ("AdamH-qknorm", "AdamH", "B2-H", "SphereAdam")
  assert sorted(rest, key=best.get) == list(rest) and min(best[a] for a in rest) > a2
  assert "end above A2's: " + ", ".join(f"{a} {best[a]:.3f}" for a in rest) + "." in words
  # The committed runs name the corpus they ran on (one Python's standard library); read the
  # arms with those facts, so the check holds under any Python.
  (corpus,) = {json.dumps(r["config"]["corpus"], sort_keys=True) for r in committed.runs}
  assert lm_grid.norms_large_arms(folder, json.loads(corpus)) == ["A2", "A2-qknorm", "Muon"]
  assert "(A2, A2-qknorm and Muon, the one arm within 0.01 of the best)" in words
  a2_grid, qk_grid = small["A2"].rates, small["AdamH-qknorm"].rates
  assert f"A2's nine rates cover {a2_grid[0]:g}-{a2_grid[-1]:g}" in words and len(a2_grid) == 9
  assert f"AdamH-qknorm's three {qk_grid[0]:g}-{qk_grid[-1]:g}" in words and len(qk_grid) == 3


def test_the_small_models_verdicts_on_the_page_are_the_runs(committed):
  """docs/lm.md, study 3's small-model verdicts: every row of the report's two paired
  tables, and every number and verdict of the words under them."""
  root = committed.root
  lines = committed.text.splitlines()
  page = (root / "docs" / "lm.md").read_text(encoding="utf-8")
  page = page.split("### The small model's verdicts")[1].split("\n### ")[0]
  words = " ".join(page.split("|")[-1].split())
  delta, verdict = {}, {}
  for base in ("A2", "A2-qknorm"):
    rows = columns.paired_rows("\n".join(lines), base)
    for arm in norms.ARMS:
      if arm == base:
        continue
      cells = rows[f"{arm} - {base}"]
      assert cells[1].endswith("(6)"), cells
      assert "| " + " | ".join(cells) + " |" in page
      delta[arm, base], verdict[arm, base] = float(cells[1].split()[0]), cells[-1]
  assert page.count("\n| ") == 2 + len(delta)  # the header, its rule and one row each
  d = {k: f"{abs(v):.3f}" for k, v in delta.items()}

  def both(arm):
    return f"{d[arm, 'A2']} and {d[arm, 'A2-qknorm']}"

  assert verdict["Muon", "A2"] == verdict["Muon", "A2-qknorm"] == "better"
  assert (
    f"ends {d['Muon', 'A2']} bits per byte below A2 and {d['Muon', 'A2-qknorm']} below" in words
  )
  assert verdict["MuonH", "A2"] == verdict["MuonH", "A2-qknorm"] == "not settled"
  assert all(delta["MuonH", b] < 0 for b in ("A2", "A2-qknorm"))
  assert f"(-{d['MuonH', 'A2']} and -{d['MuonH', 'A2-qknorm']}) are not settled" in words
  worse = ("AdamH-qknorm", "AdamH", "B2-H", "SphereAdam")
  assert all(verdict[a, b] == "worse" for a in (*worse, "B2") for b in ("A2", "A2-qknorm"))
  assert sorted(worse, key=lambda a: delta[a, "A2"]) == list(worse)
  names = dict(zip(worse, ("AdamH-qknorm", "AdamH", "B2-H", "the Riemannian sphere Adam")))
  listed = ", ".join(f"{names[a]} by {both(a)}" for a in worse[:-1])
  assert f"{listed}, and {names[worse[-1]]} by {both(worse[-1])}." in words
  assert f"is worse than both by {both('B2')}" in words
  assert verdict["A2-qknorm", "A2"] == "no difference"
  assert f"against A2 (-{d['A2-qknorm', 'A2']}) is no difference" in words
  assert f"(AdamH) ends {d['AdamH', 'A2']} above A2" in words
  assert (
    f"from A2 (-{d['MuonH', 'A2']}) is less than a third of Muon's (-{d['Muon', 'A2']})" in words
  )
  assert 3 * abs(delta["MuonH", "A2"]) < abs(delta["Muon", "A2"])


def test_the_your_model_muon_recipe_is_the_study_arm_and_its_numbers_are_the_runs(committed):
  """docs/howto/your-model.md, "Language models": its recipe's updates equal the study's
  Muon arm at the small model's best cell on the LM's own parameters, and every number
  of the words above it is the report's."""
  import re

  import jax
  import optax

  from stiefax.experiments.lm import training

  root = committed.root
  page = (root / "docs" / "howto" / "your-model.md").read_text(encoding="utf-8")
  section = page.split("## Language models\n")[1].split("\n### QK-norm")[0]
  (code,) = re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
  namespace: dict = {}
  exec(compile(code, "your-model.md[Muon]", "exec"), namespace)
  tx = namespace["tx"]

  small = committed.grids[norms.SMALL_PRESET]
  cfg = lm_config.PRESETS[norms.SMALL_PRESET]
  assert (namespace["steps"], namespace["warmup"]) == (cfg.steps, cfg.warmup_steps)
  best = small["Muon"].best
  assert f"schedule({best:g})" in code and f"Muon {best:g} of a grid" in section
  assert f"schedule({norms.REST_LR:g})" in code and f"AdamW {norms.REST_LR:g}, A2's best" in section
  assert small["A2"].best == norms.REST_LR
  c = dataclasses.replace(cfg, **{**norms.fixed("Muon", cfg.matrix_lr), "matrix_lr": best})
  arm = arms.ARMS["Muon"]
  ours = training.programs(c, arm)
  params = training.init_params(c, arm, 0)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  grads = [treedef.unflatten([jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])]
  grads = [jax.tree.map(lambda g, i=i: g * (1 + i), grads[0]) for i in range(3)]
  p_doc, p_arm = params, params
  s_doc, s_arm = tx.init(params), ours.tx.init(params)
  update_doc, update_arm = jax.jit(tx.update), jax.jit(ours.tx.update)
  for g in grads:
    u_doc, s_doc = update_doc(g, s_doc, p_doc)
    u_arm, s_arm = update_arm(g, s_arm, p_arm)
    p_doc, p_arm = optax.apply_updates(p_doc, u_doc), optax.apply_updates(p_arm, u_arm)
  moved = jax.tree.map(lambda a, b: float(abs(a - b).max()), p_arm, params)
  assert min(jax.tree.leaves(moved)) > 0
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), p_doc, p_arm)

  lines = committed.text.split("study 3, the larger")[0]
  delta = {}
  for base in ("A2", "A2-qknorm"):
    for name, cells in columns.paired_rows(lines, base).items():
      delta[name] = (float(cells[1].split()[0]), cells[-1])
  words = " ".join(section.split("```")[0].split())
  _the_other_pages_say_the_same(root, delta)
  muon_q, muon_a = delta["Muon - A2-qknorm"], delta["Muon - A2"]
  assert muon_q[1] == muon_a[1] == "better"
  assert (
    f"ends {-muon_q[0]:.3f} bits per byte below QK-norm and {-muon_a[0]:.3f} below AdamW" in words
  )
  adamh, muonh = delta["AdamH - A2-qknorm"], delta["MuonH - A2-qknorm"]
  assert adamh[1] == "worse" and muonh[1] == "not settled"
  assert f"(`stiefax.adamh`, {adamh[0]:+.3f}) and is not settled over Muon" in words
  assert f"(`stiefax.muonh`, {muonh[0]:.3f})" in words


def _the_other_pages_say_the_same(root, delta):
  """docs/index.md ("When it helps") and docs/optimizers.md (Hyperball's section) quote
  the small model's contrasts against QK-norm: each number and verdict is the report's."""
  q = {k.removesuffix(" - A2-qknorm"): v for k, v in delta.items() if k.endswith("A2-qknorm")}
  assert q["Muon"][1] == "better" and q["MuonH"][1] == "not settled"
  assert q["AdamH"][1] == q["SphereAdam"][1] == "worse"
  index = " ".join((root / "docs" / "index.md").read_text(encoding="utf-8").split())
  assert (
    f"Optax's Muon on every hidden matrix beats QK-norm by {-q['Muon'][0]:.3f} bits per byte,"
    f" while holding every hidden matrix at its norm is not shown to help (Hyperball over Adam"
    f" ends {q['AdamH'][0]:.3f} above QK-norm; over Muon, {q['MuonH'][0]:.3f}, not settled;"
    " 6 paired seeds each)" in index
  )
  optimizers = " ".join((root / "docs" / "optimizers.md").read_text(encoding="utf-8").split())
  assert (
    f"against QK-norm, AdamH ends {q['AdamH'][0]:.3f} bits per byte above (worse), MuonH"
    f" {q['MuonH'][0]:.3f} (not settled) and the sphere Adam {q['SphereAdam'][0]:.3f} above"
    f" (worse), 6 paired seeds each; Optax's Muon without the sphere ends"
    f" {-q['Muon'][0]:.3f} below (better)." in optimizers
  )


def _own_runs(root, runs):
  """``{preset: [run]}`` of study 3's own runs: those whose file is not a copy of study
  2's (``--reuse results/lm-fair`` copies a file byte for byte)."""
  folder, fair = root / "results" / "lm-norms", root / "results" / "lm-fair"
  own: dict = {}
  for r in runs:
    name = lm_runs.run_name(r["arm"], r["config"], r["seed"])
    if (fair / name).is_file() and (fair / name).read_bytes() == (folder / name).read_bytes():
      continue
    own.setdefault(r["config"]["preset"], []).append(r)
  return own


def test_the_larger_model_and_the_transfer_on_the_page_are_the_runs(committed):
  """docs/lm.md, study 3's larger model: the quoted tables (grids, each arm at its best
  with the paired tables, the transfer), the budget's core-hours and every number of
  the words under them, from results/lm-norms."""
  root = committed.root
  lines = committed.text.splitlines()
  lines = lines[next(k for k, x in enumerate(lines) if x.startswith("study 3, the larger")) :]
  page = (root / "docs" / "lm.md").read_text(encoding="utf-8")
  page = page.split("### The larger model and the transfer")[1].split("\n### ")[0]
  for start, stop in (
    ("each arm's grid", "tuning budget"),
    ("learning-rate", "each arm at its best"),
    ("each arm at its best", "against A2:"),
    ("transfer:", None),
  ):
    quoted = columns.fit(_section(lines, start, stop))
    assert f"```\n{quoted}\n```" in page, quoted
  words = " ".join(page.split("```")[-1].split())
  head = " ".join(page.split("```")[0].split())
  every = committed.grids
  small, large = every[norms.SMALL_PRESET], every[norms.LARGE_PRESET]
  assert list(large) == ["A2", "A2-qknorm", "Muon"]
  assert all(g.final and not g.at_edge for g in large.values())
  # The budget: study 3's own runs, and what Muon's seeds 2-5 would have added.
  own = _own_runs(root, committed.runs)
  hours = {p: sum(r["wall_time"] for r in rs) / 3600 for p, rs in own.items()}
  total = sum(hours.values())
  muon = [r for r in own[norms.LARGE_PRESET] if r["arm"] == "Muon"]
  more = 4 * np.mean([r["wall_time"] for r in muon]) / 3600
  assert total <= 18 < total + more
  assert not large["Muon"].seeds_at(large["Muon"].best).keys() - {0, 1}
  assert (
    f"study 3's own runs took {total:.1f} core-hours: {len(own[norms.SMALL_PRESET])} on the"
    f" small model ({hours[norms.SMALL_PRESET]:.1f}) and {len(own[norms.LARGE_PRESET])} on"
    f" the larger one ({hours[norms.LARGE_PRESET]:.1f})" in head
  )
  assert (
    f"Muon's seeds 2-5 there would have taken about {more:.1f} more (four runs at the"
    f" {np.mean([r['wall_time'] for r in muon]) / 60:.0f} core-minutes its {len(muon)} runs"
    f" there averaged), {total + more:.1f} in all" in head
  )
  # The paired table: every row of the report's two, and nothing else.
  text = "\n".join(lines)
  rows = {**columns.paired_rows(text, "A2"), **columns.paired_rows(text, "A2-qknorm")}
  assert all("| " + " | ".join(cells) + " |" in page for cells in rows.values())
  assert page.count("\n| ") == 2 + len(rows) == 6
  # The words under the tables.
  for arm, below in (("A2", 0.000611), ("A2-qknorm", 0.00111)):
    low = min(large[arm].rates)
    assert f"{low:.3g}" == f"{below:g}" and large[arm].mean(low) > large[arm].mean(large[arm].best)
    assert f"{arm} at {below:g} ({large[arm].mean(low):.3f})" in words
  qk = rows["A2-qknorm - A2"]
  assert qk[1].endswith("(6)") and qk[-1] == "no difference"
  assert f"A2-qknorm against A2 ({qk[1].split()[0]}, 6 paired seeds) is no difference" in words
  own_best = {arm: g.mean(g.best) for arm, g in large.items()}
  assert min(own_best, key=own_best.get) == "Muon"
  assert (
    f"Muon's best cell ({large['Muon'].best:.3g}: {own_best['Muon']:.3f}) is"
    f" {own_best['A2-qknorm'] - own_best['Muon']:.3f} below A2-qknorm's"
    f" ({large['A2-qknorm'].best:.3g}: {own_best['A2-qknorm']:.3f}) and"
    f" {own_best['A2'] - own_best['Muon']:.3f} below A2's"
    f" ({large['A2'].best:.3g}: {own_best['A2']:.3f})" in words
  )
  m_qk, m_a2 = rows["Muon - A2-qknorm"], rows["Muon - A2"]
  assert m_qk[1].endswith("(2)") and m_a2[1].endswith("(2)")
  assert m_qk[-1] == m_a2[-1] == "not settled"
  d_qk, d_a2 = (-float(c[1].split()[0]) for c in (m_qk, m_a2))
  assert f"two seeds end {d_qk:.3f} below A2-qknorm and {d_a2:.3f} below A2 on the test" in words
  for arm in large:  # the transfer: each best one x3 step down, and its gap
    s, b = small[arm].best, large[arm].best
    assert round(math.log(b / s, 3)) == -1
    gap = large[arm].mean(s) - large[arm].mean(b)
    assert f"{arm} from {s:.3g} to {b:.3g} (+{gap:.3f} at {s:.3g})" in words, (arm, gap)
  sensitivity = {
    cells[0]: cells[1].split()[0]
    for cells in columns.table_rows(_section(lines, "learning-rate", "each arm at its best"))
  }
  assert sorted(sensitivity, key=lambda a: float(sensitivity[a]))[0] == "A2-qknorm"
  assert (
    f"(sensitivity {sensitivity['A2-qknorm']} over four rates, against Muon's"
    f" {sensitivity['Muon']} and A2's {sensitivity['A2']};" in words
  )


def test_study_threes_plain_words_are_the_runs(committed):
  """docs/lm.md, "Study 3 in plain words": every contrast it names, on either model, is
  the report's (its sign, its verdict, its three decimals), and the transfer's gaps."""
  root = committed.root
  text = committed.text
  small_text, large_text = text.split("study 3, the larger model")
  page = (root / "docs" / "lm.md").read_text(encoding="utf-8")
  words = " ".join(page.split("### Study 3 in plain words")[1].split("\n## ")[0].split())

  def contrasts(report):
    got = {}
    for base in ("A2", "A2-qknorm"):
      for name, cells in columns.paired_rows(report, base).items():
        got[name] = (float(cells[1].split()[0]), int(cells[1].split()[1].strip("()")), cells[-1])
    return got

  small, large = contrasts(small_text), contrasts(large_text)

  def size(d):
    return f"{abs(d[0]):.3f}"

  muon_qk, muon_a2 = small["Muon - A2-qknorm"], small["Muon - A2"]
  assert muon_qk[1:] == muon_a2[1:] == (6, "better") and muon_qk[0] < 0 and muon_a2[0] < 0
  others = [n for n, c in small.items() if c[2] == "better"]
  assert sorted(others) == ["Muon - A2", "Muon - A2-qknorm"]
  assert (
    f"ends {size(muon_qk)} bits per byte below QK-norm and {size(muon_a2)} below AdamW: better"
    " than both by both intervals on 6 paired seeds" in words
  )
  big_qk, big_a2 = large["Muon - A2-qknorm"], large["Muon - A2"]
  assert big_qk[1:] == big_a2[1:] == (2, "not settled") and big_qk[0] < 0 and big_a2[0] < 0
  assert f"its two seeds end {size(big_qk)} below QK-norm and {size(big_a2)} below AdamW" in words
  for arm, said in (
    ("AdamH", "(AdamH) is worse than QK-norm by {}"),
    ("AdamH-qknorm", "AdamH-qknorm, by {})"),
    ("B2-H", "with AdamH on every other matrix by {};"),
    ("SphereAdam", "ends furthest above QK-norm, by {};"),
  ):
    c = small[f"{arm} - A2-qknorm"]
    assert c[2] == "worse" and c[0] > 0 and said.format(size(c)) in words, (arm, c)
  worst = max((c[0], n) for n, c in small.items() if n.endswith(" - A2-qknorm"))
  assert worst[1] == "SphereAdam - A2-qknorm"
  muonh = small["MuonH - A2-qknorm"]
  assert muonh[2] == "not settled" and f"QK-norm, {muonh[0]:.3f}, is not settled" in words
  b2_qk, b2_a2 = small["B2 - A2-qknorm"], small["B2 - A2"]
  assert b2_qk[2] == b2_a2[2] == "worse"
  assert f"worse than QK-norm by {size(b2_qk)} and than AdamW by {size(b2_a2)}" in words
  qk_small, qk_large = small["A2-qknorm - A2"], large["A2-qknorm - A2"]
  assert qk_small[1:] == qk_large[1:] == (6, "no difference")
  assert f"at either scale ({qk_small[0]:.3f} and {qk_large[0]:.3f}, 6 paired seeds each" in words
  every = committed.grids
  gap = {
    arm: g.mean(every[norms.SMALL_PRESET][arm].best) - g.mean(g.best)
    for arm, g in every[norms.LARGE_PRESET].items()
  }
  assert (
    f"cost {gap['A2-qknorm']:.3f} (QK-norm), {gap['Muon']:.3f} (Muon) and {gap['A2']:.3f}"
    " (AdamW) bits per byte there" in words
  )
  assert sorted(gap, key=gap.get) == ["A2-qknorm", "Muon", "A2"]
  assert not {"AdamH", "MuonH", "AdamH-qknorm", "B2-H"} & set(every[norms.LARGE_PRESET])


def test_the_larger_models_answer_on_every_page_is_the_runs(committed):
  """README, docs/index.md and docs/howto/your-model.md give the larger model's Muon
  against QK-norm (two seeds, no verdict) and the move of the best rates, as the report
  has them."""
  root = committed.root
  text = committed.text.split("study 3, the larger")[1]
  cells = columns.paired_rows(text, "A2-qknorm")["Muon - A2-qknorm"]
  assert cells[1].endswith("(2)") and cells[-1] == "not settled" and cells[1].startswith("-")
  below = f"{-float(cells[1].split()[0]):.3f}"
  every = committed.grids
  small, large = every[norms.SMALL_PRESET], every[norms.LARGE_PRESET]
  steps = {round(math.log(g.best / small[arm].best, 3)) for arm, g in large.items()}
  assert steps == {-1}

  def read(name):
    return " ".join((root / name).read_text(encoding="utf-8").split())

  assert (
    f"On the 4x larger model Muon's two seeds end {below} below QK-norm (no verdict: the budget"
    " cut its other four), and every arm's best rate there is one x3 step below its"
    " small-model best" in read("README.md")
  )
  assert (
    f"On the 4x larger model Muon's two seeds end {below} below QK-norm, no verdict (the budget"
    " cut its other four seeds), and no arm's best rate carried over from the small model"
    in read("docs/index.md")
  )
  muon = large["Muon"]
  gap = muon.mean(small["Muon"].best) - muon.mean(muon.best)
  page = read("docs/howto/your-model.md")
  assert f"Muon's two seeds end {below} below QK-norm: the same direction, and no verdict" in page
  assert (
    f"on the larger model its best was {muon.best:g}, one x3 step lower, and"
    f" {small['Muon'].best:g} cost {gap:.3f} bits per byte there." in page
  )
