"""The README's quantitative sentences against ``stiefax report`` on the committed runs.

Each number, range, count and "every cell" / "n of 4" claim of the README's study
paragraphs is recomputed here from the report of ``results/`` and looked up in the
README (whitespace-insensitive), so a result that changes a number changes the
sentence or fails this test. The study pages are tied to their reports the same way
(``tests/test_lm.py``, ``tests/test_grok.py``).
"""

import pathlib
import re
import tempfile

import pytest

from stiefax.experiments import report as report_lib
from tests import columns

ROOT = pathlib.Path(__file__).resolve().parents[1]
CELLS = ((1, "0.01"), (1, "0.001"), (2, "0.01"), (2, "0.001"))  # the main cell first


def _flat(text: str) -> str:
  return " ".join(text.split())


def _report(dirs, experiment):
  runs_again: list = []
  groups, warnings = report_lib.load_runs([ROOT / d for d in dirs], runs_again)
  assert warnings == []
  module = report_lib._reporter(experiment)  # pylint: disable=protected-access
  runs = groups[experiment]
  with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
    mp.setattr(report_lib, "pyplot", lambda: None)  # tables only
    if experiment == "patches":
      again = [copy for _, copy, _ in runs_again if copy.get("experiment") == experiment]
      return module(runs, pathlib.Path(tmp), again=again), runs
    return module(runs, None), runs


@pytest.fixture(scope="module")
def patches():
  return _report(["results/patches", "results/checks/patches-rerun"], "patches")


@pytest.fixture(scope="module")
def readme():
  return _flat((ROOT / "README.md").read_text())


def _section(text: str, title: str) -> list[str]:
  block = text.split(title, 1)[1].split("\n\n", 1)[0]
  return block.splitlines()


def _contrasts(text: str) -> dict:
  """``{"b - a": [(Δ, wins, n, verdict) per cell in CELLS order]}``."""
  out = {}
  for line in _section(text, "patches (contrasts across settings)")[3:]:
    m = re.search(r"(\S+ - \S+)\s+(.*)$", line)
    if m is None:
      continue
    cells = re.findall(r"([+-]\d+\.\d+) \((\d+)/(\d+), ([a-z ]+)\)", m.group(2))
    out[m.group(1)] = [(float(d), int(w), int(n), v) for d, w, n, v in cells]
  return out


def _shares(text: str) -> list[tuple[float, str]]:
  rows = []
  for line in _section(text, "patches (frozen share)")[3:]:
    m = re.search(r"(\d\.\d\d)\s+(\[\d\.\d\d, \d\.\d\d\])$", line)
    if m:
      rows.append((float(m.group(1)), m.group(2)))
  return rows


def _probe(text: str) -> dict:
  """``{(depth, rate, arm): (seeds, max logit at the end)}``."""
  out = {}
  for line in _section(text, "patches (attention)")[3:]:
    m = re.match(r"(\d)\s+(\S+)\s+(\S+)\s+(\d+)(?: \(\d+ rerun\))?\s+(\S+)\s", line)
    if m:
      out[(int(m.group(1)), m.group(2), m.group(3))] = (int(m.group(4)), float(m.group(5)))
  return out


def _span(values, fmt="{:.1f}", sep=" to "):
  return fmt.format(min(values)) + sep + fmt.format(max(values))


def _paired_means(runs, b, a) -> list[float]:
  """The mean paired difference ``b - a`` in pp (test accuracy), per cell in CELLS order,
  from the runs themselves (no rounding of a printed table before rounding again)."""
  out = []
  for depth, rate in CELLS:

    def acc(arm, depth=depth, rate=rate):
      return {
        r["seed"]: r["metrics"]["test_acc"]
        for r in runs
        if r["config"]["protocol"] == "run"
        and r["arm"] == arm
        and r["config"]["depth"] == depth
        and r["config"]["adamw_lr"] == float(rate)
        and (r["config"]["n_train"], r["config"]["epochs"]) == (10_000, 40)
        and r["config"].get("eps") in (None, 1e-8)
      }

    xa, xb = acc(a), acc(b)
    seeds = sorted(set(xa) & set(xb))
    assert len(seeds) >= 6, (b, a, depth, rate)
    out.append(100 * sum(xb[s] - xa[s] for s in seeds) / len(seeds))
  return out


def test_the_image_patch_sentences(patches, readme):
  text, runs = patches
  c = _contrasts(text)
  # B2 - A2 is in each cell's run table: every seed, verdict "higher".
  for depth, rate in CELLS:
    head = f"depth={depth} d=128 H=8 r=16 adamw_lr={rate}\n"
    row = next(ln for ln in text.split(head, 1)[1].splitlines() if ln.startswith("B2 "))
    k, n = row.split()[8].split("/")
    assert k == n and " higher " in row, (depth, rate, row)  # every setting and seed
  gains = _paired_means(runs, "B2", "A2")
  assert f"beat AdamW by {_span(gains)} pp" in readme
  assert f"B2 beats AdamW by +{gains[0]:.1f} pp" in readme
  assert f"B2 beats AdamW by +{min(gains[1:]):.1f} to +{max(gains[1:]):.1f} pp" in readme

  # Against the logit controls: every cell, every seed, verdict "higher".
  for key in ("frozen - A2-qknorm", "frozen - A2-sigma", "B2 - A2-qknorm", "B2 - A2-sigma"):
    assert len(c[key]) == 4 and all(w == n and v == "higher" for _, w, n, v in c[key]), key
  fq = _paired_means(runs, "frozen", "A2-qknorm")
  fs = _paired_means(runs, "frozen", "A2-sigma")
  b2c = _paired_means(runs, "B2", "A2-qknorm") + _paired_means(runs, "B2", "A2-sigma")
  assert f"QK-norm and σReparam, by {_span(b2c)} pp, in every setting and seed" in readme
  assert (
    f"frozen frames by {_span(fq)} pp over QK-norm and {_span(fs)} pp over σReparam,"
    f" B2 by {_span(b2c)} pp" in readme
  )
  qk_d = _paired_means(runs, "A2-qknorm", "A2")
  assert f"moves its accuracy by {min(qk_d):+.1f} to {max(qk_d):+.1f} pp" in readme
  assert not any(v == "higher" for *_, v in c["A2-sigma - A2"])  # "helps in no cell"

  # The frozen share.
  shares = _shares(text)
  assert len(shares) == 4
  assert f"earn {shares[0][0] * 100:.0f}% of that gain (interval {shares[0][1]})" in readme
  others = [s for s, _ in shares[1:]]
  assert f"they earn {min(others) * 100:.0f}–{max(others) * 100:.0f}% of it" in readme
  every = [s for s, _ in shares]
  assert f"already earn {min(every) * 100:.0f}-{max(every) * 100:.0f}% of that gain" in readme

  # The logit bound: QK-norm's end logit against the orthonormal arms', per cell.
  probe = _probe(text)
  qk_end = [probe[(d, r, "A2-qknorm")][1] for d, r in CELLS]
  a2_end = [probe[(d, r, "A2")][1] for d, r in CELLS]
  below_b2 = sum(q < probe[(d, r, "B2")][1] for q, (d, r) in zip(qk_end, CELLS))
  below_fz = sum(q < probe[(d, r, "frozen")][1] for q, (d, r) in zip(qk_end, CELLS))
  words = {2: "two", 3: "three", 4: "all four"}
  assert (
    f"its largest logit at the end of training ({_span(qk_end)}) is below B2's in"
    f" {words[below_b2]} of the four settings and below the frozen frames' in"
    f" {words[below_fz]} (the orthonormal arms' logits measured on 3 seeds per setting)" in readme
  )
  seeds = {probe[(d, r, a)][0] for d, r in CELLS for a in ("B2", "frozen")}
  assert seeds == {3}
  assert {probe[(d, r, "A2")][0] for d, r in CELLS} == {3}
  assert (
    f"bounds AdamW's attention logits ({min(qk_end):.1f}-{max(qk_end):.0f} at the end,"
    f" against {min(a2_end):.0f}-{max(a2_end):.0f}; AdamW's on 3 seeds per setting)" in readme
  )

  # B2-qknorm ran in the main cell only.
  cells = {(r["config"]["depth"], r["config"]["adamw_lr"]) for r in runs if r["arm"] == "B2-qknorm"}
  assert cells == {(1, 0.01)}
  assert "in the main cell, the only one where it was run, QK-norm on B2's frames" in readme
  main = next(ln for ln in text.splitlines() if "B2-qknorm - B2" in ln)
  assert "  no difference  " in main and "makes no detectable difference" in readme

  # Frozen frames against AdamW on the patches, quoted beside the grokking result.
  fa = _paired_means(runs, "frozen", "A2")
  assert f"which they beat by {_span(fa)} pp on the patches" in readme
  assert all(v == "higher" for *_, v in c["B2 - frozen"])  # "B2 beats them in all four"
  assert "where B2 beats them in all four settings" in readme


def test_the_language_model_sentences(readme):
  from stiefax.experiments.lm import config as lm_config  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm import runs as lm_runs  # pylint: disable=g-import-not-at-top

  text, runs = _report(["results/lm"], "lm")
  sweep = {}
  for line in _section(text, "learning-rate sweep"):
    parts = line.split()
    if parts and parts[0] in lm_config.ARMS:
      sweep[parts[0]] = (int(parts[1]), float(parts[-2]))
  best = {}
  for line in _section(text, "each arm at its best rate"):
    parts = line.split()
    if len(parts) > 7 and parts[0] in sweep:
      delta = None if parts[6] == "-" else float(parts[6])
      best[parts[0]] = (int(parts[2]), float(parts[3]), delta)
  assert all(n == 2 for n, _ in sweep.values())  # "a two-seed sweep"
  ratio = sweep["B2"][1] / sweep["A2"][1]
  assert (
    0.4 < ratio < 0.6
    and "the constraint about halves AdamW's learning-rate sensitivity in a two-seed sweep"
    in readme
  )
  d_b2 = best["B2"][2]
  assert (
    d_b2 > 0 and f"ends {d_b2:.3f} bits per byte worse at its best rate (6 paired seeds)" in readme
  )
  assert best["B2"][0] == best["A2"][0] == 6
  assert sweep["A2-qknorm"][1] < min(sweep["A2"][1], sweep["B2"][1])  # "the flatter sweep"
  assert (
    "2 layers, d = 128, 1 000 steps" in readme
    and "at both scales measured, for language models" in readme
  )
  cfg = runs[0]["config"]
  assert (cfg["depth"], cfg["d_model"], cfg["steps"]) == (2, 128, 1000)
  assert len(runs) == 126 and "The language-model study is complete (126 runs" in readme
  assert "runs are in progress" not in readme
  assert lm_runs.select_rate([r for r in runs if r["arm"] == "A2" and r["seed"] < 2]) == 0.003


def test_the_second_language_model_study_sentence(readme):
  """Study 2 (results/lm-fair, the small model): every Stiefel arm at its best cell is
  worse than QK-norm at its best rate, by the span the README gives, on 6 paired seeds
  with both intervals agreeing; QK-norm and AdamW show no difference."""
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm import fair  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm.runs import loss_of  # pylint: disable=g-import-not-at-top

  groups, warnings = report_lib.load_runs(ROOT / "results/lm-fair")
  assert warnings == []
  small = [r for r in groups["lm"] if r["config"]["preset"] == fair.SMALL_PRESET]
  best = fair.best_cells(small)

  def test_losses(arm):
    return {
      r["seed"]: loss_of(r, "test_bpb")
      for r in small
      if r["arm"] == arm and fair.cell_of(r) == best[arm]
    }

  def contrast(b, a):
    tb, ta = test_losses(b), test_losses(a)
    assert sorted(tb) == sorted(ta) == list(range(6)), (b, a)
    return stats.paired([ta[s] for s in range(6)], [tb[s] for s in range(6)])

  deltas = []
  for arm in fair.STIEFEL_ARMS:
    p = contrast(arm, "A2-qknorm")
    assert p.verdict == "b > a", arm  # worse, both intervals agreeing
    deltas.append(p.mean)
  assert (
    f"every Stiefel variant still ends {min(deltas):.3f} to {max(deltas):.3f} bits per byte"
    f" above QK-norm at its best setting (6 paired seeds each)" in readme
  )
  assert contrast("A2-qknorm", "A2").verdict == "no difference"  # "end level"
  assert "QK-norm and AdamW, tuned on a finer grid, show no difference (not shown equal)" in readme


def test_the_grokking_sentences(readme):
  from stiefax.experiments.grok import tables  # pylint: disable=g-import-not-at-top

  groups, warnings = report_lib.load_runs(ROOT / "results/grok")
  assert warnings == []
  # The sentences are about seed 0 at the paper's default setting (the studies' other
  # seeds and the stabilized runs have tables of their own).
  runs = {r["arm"]: r for r in groups["grok"] if r["seed"] == 0 and not r["config"]["stabilize"]}
  m = {arm: r["metrics"] for arm, r in runs.items()}

  def tail(arm):
    return f"{m[arm]['tail_test_acc']:.2f}"

  def epoch(v):
    return f"{v:,}".replace(",", " ")

  assert f"A2 groks at epoch {epoch(m['A2']['grokked_epoch'])}" in readme
  assert f"B2 only briefly at {epoch(m['B2']['grokked_epoch'])}" in readme
  assert m["B2"]["sustained_epoch"] is None
  assert f"lower tail accuracy ({tail('B2')} against {tail('A2')})" in readme
  assert m["B2-frz"]["grokked_epoch"] is None and f"never groks (tail {tail('B2-frz')})" in readme
  # Frozen below trained (B2) and below AdamW at this seed.
  assert m["B2-frz"]["tail_test_acc"] < m["B2"]["tail_test_acc"] < m["A2"]["tail_test_acc"]
  assert f"do worse than trained ones (B2, {tail('B2')})" in readme
  assert f"they also do worse than AdamW ({tail('A2')})" in readme
  assert (
    f"at {epoch(m['B2m']['grokked_epoch'])}, with the paper's tail mean ({tail('B2m')})" in readme
  )
  assert m["B2m-can"]["grokked_epoch"] is None and f"B2m's tail mean ({tail('B2m-can')})" in readme
  assert tables.report(list(runs.values()), None)  # the committed runs report


def test_the_run_counts(readme):
  def count(*dirs):
    return sum(len(list((ROOT / d).rglob("*.json"))) for d in dirs)

  assert f"the language-model study's {count('results/lm')} runs" in readme
  quick = count("results/checks/grok-quick-t1", "results/checks/grok-quick-t2")
  assert f"the quick grokking preset's {quick} runs" in readme
  assert f"{count('results/patches/optimizers')} on CIFAR-10" in readme


@pytest.mark.slow
def test_every_verdict_is_the_same_for_every_resample_seed(monkeypatch):
  """The report's text, verdicts and intervals included, does not move with the
  bootstrap's resample seed (exact enumeration up to 12 seeds)."""
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  texts = []
  for seed in (0, 12345):
    monkeypatch.setattr(stats, "RESAMPLE_SEED", seed)
    texts.append(_report(["results/patches/main", "results/patches/robust"], "patches")[0])
    texts.append(_report(["results/lm"], "lm")[0])
  assert texts[0] == texts[2] and texts[1] == texts[3]


def test_the_larger_language_model_sentence(readme):
  """Study 2's larger model (results/lm-fair, preset large): both Stiefel arms run there
  are worse than QK-norm at its best cell on 6 paired seeds, by the numbers the README
  gives, and QK-norm and AdamW end level there too ("at both scales measured")."""
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm import fair  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm.runs import loss_of  # pylint: disable=g-import-not-at-top

  groups, warnings = report_lib.load_runs(ROOT / "results/lm-fair")
  assert warnings == []
  large = [r for r in groups["lm"] if r["config"]["preset"] == fair.LARGE_PRESET]
  best = fair.best_cells(large)
  for arm, cell in best.items():  # every larger-model best at its grid's lowest rate
    assert cell[0] == min(fair.cell_of(r)[0] for r in large if r["arm"] == arm), arm
  assert "every best rate of the larger model is the lowest of its grid" in readme

  def losses(arm):
    at = [r for r in large if r["arm"] == arm and fair.cell_of(r) == best[arm]]
    return {r["seed"]: loss_of(r, "test_bpb") for r in at}

  def contrast(b, a):
    lb, la = losses(b), losses(a)
    assert sorted(lb) == sorted(la) == list(range(6)), (b, a)
    return stats.paired([la[s] for s in range(6)], [lb[s] for s in range(6)])

  stiefel = sorted(a for a in best if a.startswith("B2"))
  assert len(stiefel) == 2
  deltas = [contrast(arm, "A2-qknorm") for arm in stiefel]
  assert all(p.verdict == "b > a" for p in deltas)
  lo, hi = sorted(p.mean for p in deltas)
  assert (
    f"the two Stiefel arms run there end {lo:.3f} and {hi:.3f} above QK-norm"
    f" (6 paired seeds each): at both scales measured" in readme
  )
  assert contrast("A2-qknorm", "A2").verdict == "no difference"


def test_the_third_language_model_study_sentence(readme):
  """Study 3's small model (results/lm-norms, preset sweep): Muon better than QK-norm,
  MuonH not settled, and every other constant-norm arm worse, by the numbers the README
  gives, each on 6 paired seeds at a best inside its grid."""
  from stiefax.experiments.lm import norms  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.lm import norms_tables  # pylint: disable=g-import-not-at-top

  groups, warnings = report_lib.load_runs(ROOT / "results/lm-norms")
  assert warnings == []
  small = norms_tables.grids(groups["lm"])[norms.SMALL_PRESET]
  assert all(g.final and not g.at_edge for g in small.values())
  lines = norms_tables.report(groups["lm"], None)
  text = "\n".join(lines).split("study 3, the larger model")[0]
  rows = {}
  for cells in columns.paired_rows(text, "A2-qknorm").values():
    assert cells[1].endswith("(6)"), cells
    rows[cells[0].removesuffix(" - A2-qknorm")] = (float(cells[1].split()[0]), cells[-1])
  assert rows["Muon"][1] == "better" and rows["MuonH"][1] == "not settled"
  constant = ("AdamH", "AdamH-qknorm", "B2-H", "SphereAdam")
  assert all(rows[a][1] == "worse" for a in constant)
  lo, hi = min(rows[a][0] for a in constant), max(rows[a][0] for a in constant)
  assert (
    f"Optax's Muon on the hidden matrices ends {-rows['Muon'][0]:.3f} bits per byte below"
    f" QK-norm, Hyperball over Muon's difference ({rows['MuonH'][0]:.3f}) is not settled,"
    f" and every other constant-norm arm ends {lo:.3f} to {hi:.3f} above QK-norm" in readme
  )
  # The first screen's summary: Muon better than both baselines on the small model.
  against_a2 = columns.paired_rows(text, "A2")["Muon - A2"]
  assert against_a2[1].endswith("(6)") and against_a2[-1] == "better"
  assert (
    "on the smaller of the two models measured Optax's Muon on the hidden matrices beats both"
    " QK-norm and AdamW" in readme
  )
