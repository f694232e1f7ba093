"""The example scripts run end to end at a tiny step budget and keep their frames."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = (
  "quickstart.py",
  "linen_vit.py",
  "nnx_transformer.py",
  "custom_frames.py",
  "sharded_heads.py",
  "decoder_lm.py",
)
_SCI = re.compile(r"([0-9.]+e[-+][0-9]+)")
# The module fixture starts every script at once: on a loaded 2-core machine their
# start-up alone can pass the suite's 300 s default.
# Slow: every example script at its full size (python -m pytest -m slow).
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def isometry_errors(name, text):
  """The isometry errors a script printed (quickstart: the last column of its table)."""
  if name == "quickstart.py":
    rows = [l for l in text.splitlines() if l.startswith(("A2", "B2"))]
    return [float(l.split()[-1]) for l in rows]
  return [
    float(v)
    for line in text.splitlines()
    if "isometry" in line
    for v in _SCI.findall(line.split("isometry", 1)[1])
  ]


@pytest.fixture(scope="module")
def runs():
  """Every script with --steps 3, started together (they are mostly start-up time)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  procs = {
    name: subprocess.Popen(
      [sys.executable, str(EXAMPLES / name), "--steps", "3"],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for name in SCRIPTS
  }
  out = {}
  for name, proc in procs.items():
    try:
      text, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
      proc.kill()
      text, _ = proc.communicate()
    out[name] = (proc.returncode, text)
  return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_runs_and_keeps_frames_orthonormal(runs, name):
  code, text = runs[name]
  assert code == 0, f"{name} failed:\n{text}"
  isometry = isometry_errors(name, text)
  assert isometry, f"{name} printed no isometry error:\n{text}"
  if name == "quickstart.py":
    # The A2 row (AdamW on W_Q, W_K) is the control: it leaves the manifold.
    assert min(isometry) < 1e-5 < max(isometry), text
  elif name == "decoder_lm.py":
    # bfloat16 frames: orthonormal to bfloat16 rounding (eps = 2^-7).
    assert max(isometry) < 1e-2, text
  else:
    assert max(isometry) < 1e-5, text


def test_custom_frames_block_heads_are_mutually_orthogonal(runs):
  code, text = runs["custom_frames.py"]
  assert code == 0, text
  line = next(l for l in text.splitlines() if l.startswith("largest inner product"))
  per_head, block = (float(v) for v in re.findall(r"query ([0-9.e+-]+)", line))
  assert block < 1e-5 < 0.05 < per_head, line


def test_sharded_heads_update_has_no_collectives(runs):
  code, text = runs["sharded_heads.py"]
  assert code == 0, text
  assert "mesh: {'heads': 4}" in text, text  # four host devices were really used
  assert "query kernel (32, 8, 4) sharding: P(None, 'heads', None)" in text
  assert "sharding P('heads',)" in text  # per-frame state sharded with the heads
  assert "collectives in the compiled optimizer update: none" in text


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_has_a_steps_flag_and_a_docstring(name):
  text = (EXAMPLES / name).read_text()
  assert '"--steps"' in text
  assert text.startswith('"""'), f"{name} must open with a docstring saying what it shows"


def test_decoder_lm_trains_gemma_layout_in_bfloat16(runs):
  code, text = runs["decoder_lm.py"]
  assert code == 0, text
  assert "12 query/key frames in St(64, 16), all parameters bfloat16" in text
  losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", text)]
  assert len(losses) == 3 and losses[-1] < losses[0], text
  # The control: the value slices of the same fused weights train freely with AdamW.
  drift = float(re.search(r"max\|V\^T V - I\| = ([0-9.e+-]+)", text).group(1))
  assert drift > max(isometry_errors("decoder_lm.py", text)), text
