"""`stiefax report` on the paper's grokking studies: the five-seed runs (a) and (b) of
section 4.3 and Table 5 of section 4.4, from folders of synthetic run files (no
training: every test here takes well under a second)."""

import json
import re

import pytest

from stiefax.experiments import cli
from stiefax.experiments import stats
from stiefax.experiments.grok import config as grok_config
from tests import harness

SEEDS = (0, 1, 2, 3, 4)


def _write(folder, records):
  folder.mkdir(parents=True, exist_ok=True)
  for r in records:
    stab = "-stab" if r["config"]["stabilize"] else ""
    (folder / f"{r['arm']}{stab}-s{r['seed']}.json").write_text(json.dumps(r))
  return folder


def _five_seed_runs(seeds=SEEDS):
  """Run (a): A2 groks in every seed (tail 0.95 + 0.01 s), B2 in four (tail 0.70 +
  0.02 s); run (b): A2 in every seed, B2 in two; Table 5's arms at seed 0."""
  runs = []
  for s in seeds:
    runs.append(harness.grok_record("A2", s, grok_at=4000 + 100 * s, level=0.95 + 0.01 * s))
    b2_at = None if s == 4 else 8000 + 200 * s
    runs.append(harness.grok_record("B2", s, grok_at=b2_at, level=0.70 + 0.02 * s))
    runs.append(harness.grok_record("A2", s, grok_at=2000 + 100 * s, level=0.97, stabilize=True))
    b2_at = 8800 if s < 2 else None
    runs.append(harness.grok_record("B2", s, grok_at=b2_at, level=0.80, stabilize=True))
  runs.append(harness.grok_record("A2-nwf", 0, grok_at=2500, level=0.01))
  runs.append(harness.grok_record("B2-hi", 0, grok_at=2100, level=1.0))
  runs.append(harness.grok_record("B2-sn", 0, grok_at=500, level=0.97))
  runs.append(harness.grok_record("B2-comb", 0, grok_at=2200, level=0.33))
  return runs


def _report(folder, capsys):
  assert cli.main(["report", str(folder), "--plots", str(folder / "plots")]) == 0
  out = capsys.readouterr().out
  return out[out.index("The paper's grokking studies") :]


def _row(text, *start):
  """The columns of the line whose first columns are ``start``."""
  for line in text.splitlines():
    cols = re.split(r"\s{2,}", line.strip())
    if tuple(cols[: len(start)]) == start:
      return cols
  raise AssertionError(f"no row {start} in:\n{text}")


def test_the_five_seed_tables_and_table_5(tmp_path, capsys):
  text = _report(_write(tmp_path / "grok", _five_seed_runs()), capsys)
  five, table5 = text.split("Table 5 (paper 4.4")
  # Counts, medians and tail means per study and arm.
  assert _row(five, "run (a)", "A2") == [
    "run (a)", "A2", "0-4", "5/5", "5/5", "4200", "4200", "0.970±0.016"
  ]  # fmt: skip
  assert _row(five, "run (a)", "B2")[2:6] == ["0-4", "4/5", "0/5", "8300"]
  assert _row(five, "run (b)", "A2")[3:5] == ["5/5", "5/5"]
  assert _row(five, "run (b)", "B2")[3:6] == ["2/5", "0/5", "8800"]
  assert "no runs yet" not in five
  # The paired differences of the tail mean, B2 - A2: -25 + s pp in run (a), and
  # -89 pp at seed 4, where B2 stays at 0.1.
  row = _row(five, "run (a)", "B2 - A2")
  assert row[2] == "5" and float(row[3]) == pytest.approx(-36.6) and row[6] == "0/5"
  assert row[-1] == "not settled"
  for study in ("run (a)", "run (b)"):
    assert (
      f"{study}, B2 - A2: five seeds: not settled by the project's standard (>= 6 paired"
      " seeds, the paired-t and bootstrap 95% intervals agreeing)." in five
    )
  # Table 5: run (a)'s A2 and B2 over seeds, then each harnessing arm at seed 0.
  assert _row(table5, "A2 (run (a))")[1:5] == ["0-4", "100", "4200 (5/5)", "4200 (5/5)"]
  assert _row(table5, "B2 (run (a))")[3:5] == ["8300 (4/5)", "- (0/5)"]
  assert _row(table5, "A2-nwf")[1:6] == ["0", "100", "2500", "-", "0.010"]
  assert _row(table5, "B2-hi")[1:6] == ["0", "100", "2100", "2100", "1.000"]
  assert _row(table5, "B2-sn")[4] == "500" and _row(table5, "B2-comb")[3:5] == ["2200", "-"]
  assert _row(table5, "B2-hi")[-1] == "1.00e-06" and _row(table5, "A2-nwf")[-1] == "5.00e-01"
  assert "no runs yet" not in table5


def test_the_tables_say_which_runs_are_still_missing(tmp_path, capsys):
  runs = [r for r in _five_seed_runs(seeds=(0, 1, 2)) if not r["config"]["stabilize"]]
  runs = [r for r in runs if r["arm"] not in ("B2-sn", "B2-comb")]
  text = _report(_write(tmp_path / "grok", runs), capsys)
  assert (
    "  no runs yet: run (a) A2 seeds 3-4, B2 seeds 3-4; run (b) A2 seeds 0-4, B2 seeds 0-4" in text
  )
  assert "  no runs yet: B2-sn seed 0, B2-comb seed 0" in text
  assert "run (a), B2 - A2: three seeds: not settled by the project's standard" in text
  assert _row(text, "run (a)", "A2")[2:4] == ["0-2", "3/3"]


def test_six_paired_seeds_get_the_standard_s_verdict(tmp_path, capsys):
  """From six paired seeds on, the verdict is the intervals' own, and no plain line."""
  seeds = range(stats.MIN_SEEDS)
  runs = [harness.grok_record("A2", s, grok_at=4000, level=0.90 + 0.01 * s) for s in seeds]
  runs += [harness.grok_record("B2", s, grok_at=9000, level=0.60 + 0.011 * s) for s in seeds]
  text = _report(_write(tmp_path / "grok", runs), capsys)
  row = _row(text, "run (a)", "B2 - A2")
  assert row[2] == "6" and row[-1] == "lower"  # B2 below A2 in every seed, both CIs
  assert "run (a), B2 - A2:" not in text


def test_the_study_tables_wait_for_more_than_the_quick_default(tmp_path, capsys):
  """The quick preset's default (seed 0, plain setting) gets no study tables; several
  seeds do."""
  quick = grok_config.PRESETS["quick"]["config"]
  one = [harness.grok_record(a, 0, grok_at=400, config=quick, preset="quick") for a in ("A2", "B2")]
  assert cli.main(["report", str(_write(tmp_path / "one", one))]) == 0
  assert "The paper's grokking studies" not in capsys.readouterr().out
  two = one + [harness.grok_record("A2", 1, grok_at=400, config=quick, preset="quick")]
  assert cli.main(["report", str(_write(tmp_path / "two", two))]) == 0
  out = capsys.readouterr().out
  assert "The paper's grokking studies [preset=quick epochs=800 eval_every=50]" in out
