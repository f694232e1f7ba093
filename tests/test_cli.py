"""The ``stiefax`` command line: the version flag and argument errors of every command.

A bad argument is one line on stderr (``stiefax <command>: error: ...``), exit status 2,
nothing trained or written.
"""

import argparse
import ast
import itertools
import os
import pathlib
import subprocess
import sys

import pytest

import stiefax
from stiefax.experiments import cli
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from tests import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_version_flag_prints_the_package_version(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--version"])
  assert exit_info.value.code == 0
  assert capsys.readouterr().out.strip() == f"stiefax {stiefax.__version__}"


def test_version_flag_from_the_command_line():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  proc = subprocess.run(
    [sys.executable, "-m", "stiefax.experiments.cli", "--version"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == f"stiefax {stiefax.__version__}"
  assert stiefax.__version__.count(".") == 2


def test_the_command_line_needs_no_module_preloaded_by_site():
  """``stiefax --version`` in an interpreter that imported nothing for the package: an
  editable install's import hook (and ``python -m``'s runpy) import ``importlib.util``
  first, which once hid the dispatcher's missing ``import importlib.util``."""
  code = (
    "import sys; assert 'importlib.util' not in sys.modules; "
    "from stiefax.experiments import cli; sys.exit(cli.main(['--version']))"
  )
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run(
    [sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == f"stiefax {stiefax.__version__}"


@pytest.fixture
def command_needing(monkeypatch, tmp_path):
  """Registers a command ``needy`` whose module imports the module the test names,
  which is made missing (``None`` in ``sys.modules`` fails its import)."""

  def make(missing: str) -> str:
    (tmp_path / "needy_command.py").write_text(f"import {missing}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, missing, None)
    monkeypatch.setitem(cli.COMMANDS, "needy", ("needy_command", "needs a missing module"))
    return "needy"

  yield make
  sys.modules.pop("needy_command", None)


@pytest.mark.parametrize("missing", ["tqdm", "orbax.checkpoint", "PIL"])
def test_a_command_without_the_experiments_extra_names_it_in_one_line(
  capsys, command_needing, missing
):
  name = command_needing(missing)
  dist = cli.EXPERIMENTS_EXTRA[missing.partition(".")[0]]
  err = harness.one_line_error(capsys, [name], 'pip install "stiefax[experiments]"')
  assert err.startswith(f"stiefax {name}: error: {dist} is not installed")


def test_a_missing_module_outside_the_extra_is_not_hidden(command_needing):
  name = command_needing("stiefax_missing_dependency")
  with pytest.raises(ModuleNotFoundError, match="stiefax_missing_dependency"):
    cli.main([name])


def test_the_extras_import_names_are_the_experiments_extra():
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
  extra = project["optional-dependencies"]["experiments"]
  dists = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extra}
  assert set(cli.EXPERIMENTS_EXTRA.values()) == dists


# The modules that make ``import stiefax.experiments.cli`` (and ``stiefax --help``) slow.
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "matplotlib", "scipy", "sklearn")


def _imported(code: str) -> list[str]:
  """The modules ``python -X importtime -c code`` imports, in the order it lists them."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  proc = subprocess.run(
    [sys.executable, "-X", "importtime", "-c", code],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
  return [ln.rsplit("|", 1)[-1].strip() for ln in lines[1:]]  # after the header


def _heavy(modules) -> set[str]:
  return {m for m in modules if m.split(".")[0] in HEAVY}


def test_the_command_line_imports_no_jax_flax_or_optax():
  """``python -X importtime -c "import stiefax.experiments.cli"`` (what ``stiefax --help``
  runs): the parser is built without importing any command or the library's names, so
  no jax, flax or optax module is imported; the entry point needs only the commands'
  errors (``flags``, which reads ``--arms`` against the registry of ``arms``)."""
  modules = _imported("import stiefax.experiments.cli")
  assert "stiefax.experiments.cli" in modules
  assert not _heavy(modules), sorted(_heavy(modules))
  ours = {m for m in modules if m.startswith("stiefax")}
  light = {"cli", "flags", "arms", "arm"}
  assert ours == {"stiefax", "stiefax.experiments"} | {f"stiefax.experiments.{m}" for m in light}, (
    sorted(ours)
  )


# The modules that ``stiefax <command> --help`` imports: they import JAX, Orbax, SciPy,
# Matplotlib, scikit-learn and the training code inside the functions that run a
# command (``run``, ``hyper``, the run loop, a statistic, a plot), so that the help is
# printed without them (test_command_help_imports_no_jax).
HELP_MODULES = (
  "grok/command.py",
  "grok/config.py",
  "lm/command.py",
  "lm/config.py",
  "patches/command.py",
  "patches/config.py",
  "jobs.py",
  "report.py",
  "stats.py",
  "certify.py",
  "equivariance.py",
  "covariance.py",
)


def test_experiment_modules_import_at_module_level():
  """Every import of the experiments package is a statement of its module's body, but
  for the heavy imports of the modules that a command's ``--help`` reads."""
  lazy = []
  for path in sorted((ROOT / "stiefax" / "experiments").rglob("*.py")):
    if path.relative_to(ROOT / "stiefax" / "experiments").as_posix() in HELP_MODULES:
      continue
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set()
    for node in tree.body:  # a module-level ``try`` (an optional dependency) counts too
      top.add(id(node))
      if isinstance(node, ast.Try):
        top.update(id(n) for n in node.body)
    lazy += [
      f"{path.relative_to(ROOT)}:{n.lineno}"
      for n in ast.walk(tree)
      if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top
    ]
  assert not lazy, lazy


def test_command_help_imports_no_jax():
  """``stiefax <command> --help``, for every command, runs argparse before any JAX, Flax,
  Optax, Orbax, SciPy, Matplotlib or scikit-learn import: one fresh interpreter builds
  each command's parser, prints its help, then lists the heavy modules it holds."""
  code = (
    "import contextlib, io, sys\n"
    "from stiefax.experiments import cli\n"
    "for name in cli.COMMANDS:\n"
    "  out = io.StringIO()\n"
    "  with contextlib.redirect_stdout(out):\n"
    "    try:\n"
    "      cli.main([name, '--help'])\n"
    "    except SystemExit:\n"
    "      pass\n"
    "  assert 'usage: stiefax ' + name in out.getvalue(), name\n"
    "  heavy = sorted(m for m in sys.modules if m.split('.')[0] in " + repr(HEAVY) + ")\n"
    "  print('HEAVY', name, heavy)\n"
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 0, proc.stderr
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY")]
  assert lines == [f"HEAVY {name} []" for name in cli.COMMANDS], lines


def test_help_defaults_are_the_presets():
  """Every number ``stiefax grok --help`` gives for a preset is that preset's."""
  parser = argparse.ArgumentParser()
  grok_command.add_arguments(parser)
  text = " ".join(parser.format_help().split())
  for name, preset in grok_config.PRESETS.items():
    c = preset["config"]
    assert f"{name}: {c.epochs}" in text and f"{name}: {c.eval_every}" in text
    assert f"{name}: {c.frame_lr}" in text
    assert f"{name}: {','.join(preset['arms'])}" in text
  q = grok_config.PRESETS["quick"]["config"]
  assert f"for {q.epochs} epochs (evaluation every {q.eval_every})" in text
  assert f"mod {q.modulus} with" in text and f"weight decay {q.weight_decay}," in text
  p = grok_config.PRESETS["paper"]["config"]
  assert f"{p.epochs:,}".replace(",", " ") + " epochs, evaluation every" in text
  for arm in grok_config.ARMS.values():
    assert f"{arm.name} {arm.description}" in text


def test_lm_help_describes_every_arm_and_preset_with_its_numbers():
  from stiefax.experiments.lm import command as lm_command
  from stiefax.experiments.lm import config as lm_config

  text = " ".join(lm_command.help_text().split())
  for arm in lm_config.ARMS.values():
    assert f"{arm.name} {arm.description}" in text
  for name, c in lm_config.PRESETS.items():
    assert f"{name} d={c.d_model}," in text and f"{c.steps} steps of {c.batch} x" in text


def test_lm_help_defaults_are_the_presets():
  """Every default ``stiefax lm --help`` states is the presets' value (one number when
  they share it, else each preset's), and the sweep's rates are the sweep's."""
  from stiefax.experiments.lm import command as lm_command
  from stiefax.experiments.lm import config as lm_config

  parser = argparse.ArgumentParser()
  lm_command.add_arguments(parser)
  text = " ".join(parser.format_help().split())
  presets = lm_config.PRESETS.values()
  for flag, field, words in [
    ("--lr", "adamw_lr", "(default: the preset's, {})"),
    ("--frame-lr", "frame_lr", "(default: the preset's, {})"),
    ("--matrix-lr", "matrix_lr", "(default: the preset's, {})"),
    ("--max-norm", "max_norm", "(preset's, {})"),
    ("--batch", "batch", "(preset's, {})"),
  ]:
    values = {getattr(c, field) for c in presets}
    assert len(values) == 1, (flag, values)  # one number stands for every preset
    assert words.format(f"{values.pop():g}") in text, flag
  for flag, field in [("--steps", "steps"), ("--eval-every", "eval_every")]:
    each = ", ".join(f"{n} {getattr(c, field)}" for n, c in lm_config.PRESETS.items())
    assert f"(preset's: {each})" in text, flag
  rates = lm_config.SWEEP_RATES
  assert rates[0] == 3e-4 and rates[-1] == 3e-1
  assert all(2.9 < b / a < 3.4 for a, b in itertools.pairwise(rates))  # "x3 apart"
  assert "(3e-4 to 3e-1, x3 apart)" in text and f"study 1's {len(rates)} AdamW rates" in text
  q = lm_config.PRESETS["quick"]
  described = " ".join(lm_command.help_text().split())
  assert f"weight decay {q.weight_decay:g} on matrices, b1 {q.b1:g}, b2 {q.b2:g}" in described
  assert all(c.warmup_steps * 10 == c.steps for c in presets)
  assert "the first 10% of steps" in described
  for study, arms in lm_config.ADDED_BY_STUDY.items():
    assert ", ".join(arms) in described, study
  # Every arm offered is one of the studies' or the original seven.
  assert set(lm_config.ARMS) >= {a for arms in lm_config.ADDED_BY_STUDY.values() for a in arms}


def test_patches_help_describes_every_arm_and_preset():
  """``stiefax patches --help`` describes each arm it offers and states both presets'
  sizes (the paper's with --data, digits' without)."""
  from stiefax.experiments.patches import command as patches_command
  from stiefax.experiments.patches import config as patches_config

  parser = argparse.ArgumentParser()
  patches_command.add_arguments(parser)
  help_lines = parser.format_help().splitlines()
  for name in patches_config.ARMS:
    line = next((ln for ln in help_lines if ln.split()[:1] == [name]), None)
    assert line is not None and len(line.split()) >= 3, name  # the name and a few words
  text = " ".join(" ".join(help_lines).split())
  paper, digits = patches_config.PRESETS["paper"], patches_config.PRESETS["digits"]
  for flag, key in [("--n-train", "n_train"), ("--patch", "patch"), ("--d", "d")]:
    assert f"(default {paper[key]}; digits {digits[key]})" in text, flag
  for flag, key in [("--heads", "heads"), ("--head-dim", "head_dim")]:
    assert f"(default {paper[key]}; digits {digits[key]})" in text, flag
  ns = lambda p: ",".join(map(str, p["ns"]))
  assert f"(default {ns(paper)}; digits {ns(digits)})" in text


@pytest.fixture
def tiny_preset(monkeypatch):
  monkeypatch.setitem(
    grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("A2", "B2"), seeds=(0,))
  )
  return "tiny"


@pytest.mark.parametrize(
  "argv,message",
  [
    (["--data", "/nonexistent/cifar"], "no such file"),
    (["--arms", "A2,C9"], "unknown arm 'C9'"),
    (["--heads", "4", "--head-dim", "8"], "exceeds --d 16"),
    (["--seeds", "a,b"], "--seeds"),
    (["--n-train", "1297", "--select-lr"], "needs validation images"),
    (["--batch-size", "0"], "--batch-size must be > 0"),
    (["--lr", "B2"], "ARM=VALUE"),
    (["sweep-eps", "--arms", "A2"], "sweep-eps varies"),
    (["sweep-n", "--epochs", "3"], "drop --epochs"),
  ],
)
def test_patches_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys):
  code = cli.main(["patches", *argv, "--out", str(tmp_path), "--cache", str(tmp_path)])
  err = capsys.readouterr().err.strip()
  assert code == 2
  assert message in err and err.startswith("stiefax patches: error:") and "\n" not in err


@pytest.mark.parametrize(
  "argv,match",
  [
    (["grok", "--arms", "A2,Z9"], "unknown arm(s) Z9"),
    (["grok", "--arms", ","], "names no arm"),
    (["grok", "--seeds", ""], "is empty"),
    (["grok", "--seeds", "0,x"], "comma-separated integers"),
    (["grok", "--seeds", "-1"], "non-negative"),
    (["grok", "--epochs", "30", "--eval-every", "20"], "not a multiple"),
    (["grok", "--epochs", "0"], "positive integer"),
    (["grok", "--eval-every", "0"], "positive integer"),
    (["grok", "--frame-lr", "-1"], "--frame-lr -1 must be"),
    (["grok", "--frame-lr", "nan"], "--frame-lr nan must be"),
  ],
)
def test_grok_bad_arguments_are_one_line_errors(capsys, tmp_path, argv, match):
  harness.one_line_error(capsys, argv + ["--out", str(tmp_path / "o")], match)
  assert not (tmp_path / "o").exists()  # nothing trained or written


def test_grok_unwritable_out_is_a_one_line_error(capsys, tmp_path, tiny_preset):
  blocker = tmp_path / "file"
  blocker.write_text("")
  harness.one_line_error(
    capsys, ["grok", "--preset", tiny_preset, "--out", str(blocker / "sub")], "cannot write there"
  )


def test_report_errors(capsys, tmp_path):
  harness.one_line_error(capsys, ["report", str(tmp_path / "missing")], "no such directory")
  (tmp_path / "empty").mkdir()
  harness.one_line_error(capsys, ["report", str(tmp_path / "empty")], "no runs found")


# ----------------------------------------------------------------------------
# The acceptance command on the paper's model.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "command,text",
  [
    ("grok", "Modular-arithmetic grokking, c = (a + b) mod 97"),
    ("patches", "Image-patch benchmark (paper sections 3.3, 4.1, 4.2, 4.5-4.7)."),
  ],
)
def test_command_help_describes_the_experiment(command, text, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main([command, "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert text in out and "--arms" in out


def test_report_sets_a_rerun_against_its_first_run(capsys, tmp_path):
  import json
  import shutil

  src = sorted((pathlib.Path(__file__).parent.parent / "results/patches/main").glob("run-A2-*"))
  first = src[0]
  (tmp_path / "main").mkdir()
  (tmp_path / "rerun").mkdir()  # sorted after main: the second copy
  shutil.copy(first, tmp_path / "main" / first.name)
  rec = json.loads(first.read_text())
  rec["metrics"]["test_acc"] += 0.002
  (tmp_path / "rerun" / first.name).write_text(json.dumps(rec))
  assert cli.main(["report", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  line = next(x for x in out.splitlines() if x.startswith("patches ") and first.name in x)
  assert "A2" in line and "+0.2" in line
  assert "largest |Δ| 0.2" in out
