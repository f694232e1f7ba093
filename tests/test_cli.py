"""The ``stiefax`` command itself: its version flag."""

import os
import pathlib
import subprocess
import sys

import pytest

import stiefax
from stiefax.experiments import cli

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
