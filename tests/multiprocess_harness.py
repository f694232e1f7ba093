"""Runs `examples/multiprocess.py` as 2 real processes (and 1) for the multi-process tests.

The first phase (`first_phase`) is shared by tests/test_multiprocess.py and
tests/test_checkpoint_topology.py through the session fixture `multiprocess_runs` of
conftest.py: started side by side,

* 2 processes x 2 CPU devices, mesh (data 2, model 2): the layouts heads, fsdp, both
  and the control fsdp-perturbed, STEPS steps each, every layout checkpointed after
  SAVE_STEP steps (both, to `<tmp>/from2/both`);
* 1 process x 2 devices: the unsharded reference (layout none, one device) and the
  fsdp layout on a (data 2, model 1) mesh, checkpointed to `<tmp>/from1/fsdp`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "multiprocess.py"
STEPS = 4
SAVE_STEP = 2
# Float32 rounding after STEPS steps: the sharded sums add in another order (measured
# up to 2e-7). The control's 1e-3 relative error on one process's rows moves the
# parameters by far more than this.
TOL = 2e-6
LAYOUTS = ("heads", "fsdp", "both")
STARTED = "distributed runtime up"
# XLA:CPU compiles at a low optimization level here (half the compile time, which is
# most of these tests'); the reference and the sharded runs use the same flags.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def env(devices: int) -> dict:
  out = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  out["XLA_FLAGS"] = f"{FAST_COMPILE} --xla_force_host_platform_device_count={devices}"
  return out


def start(args: list[str], devices: int = 2) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, str(SCRIPT), *args],
    cwd=ROOT,
    env=env(devices),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
  try:
    text, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    text, _ = proc.communicate()
  return proc.returncode, text


def skip_unless_started(code: int, text: str) -> None:
  """Fails, naming the cause, unless the processes started the runtime and finished."""
  if code != 0 and STARTED not in text:
    lines = [l for l in text.splitlines() if re.search(r"Error|error:|UNAVAILABLE|failed", l)]
    raise AssertionError(
      "jax.distributed with CPU (gloo) collectives did not start: "
      + (lines[-1] if lines else text[-300:])
    )
  assert code == 0, text[-4000:]


def load(prefix) -> tuple[dict, dict]:
  with np.load(f"{prefix}.npz") as z:
    params = {k: z[k] for k in z.files}
  with open(f"{prefix}.json", encoding="utf-8") as f:
    return params, json.load(f)


def max_diff(a: dict, b: dict) -> float:
  assert a.keys() == b.keys()
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def first_phase(tmp: pathlib.Path) -> dict:
  """The runs of the module docstring; their results by name, and ``tmp``."""
  common = ["--steps", str(STEPS), "--save-step", str(SAVE_STEP)]
  layouts = ",".join((*LAYOUTS, "fsdp-perturbed"))
  multi = start(
    ["--launch", "2", "--layout", layouts, "--out", str(tmp / "two")]
    + ["--save", str(tmp / "from2"), "--save-layouts", "both"]
    + common
  )
  single = start(
    ["--layout", "none,fsdp", "--mesh", "2x1", "--out", str(tmp / "one")]
    + ["--save", str(tmp / "from1"), "--save-layouts", "fsdp"]
    + common
  )
  code, text = finish(multi)
  single_code, single_text = finish(single)
  assert single_code == 0, single_text[-4000:]
  skip_unless_started(code, text)
  out = {"ref": load(tmp / "one-none"), "one-fsdp": load(tmp / "one-fsdp"), "tmp": tmp}
  for layout in (*LAYOUTS, "fsdp-perturbed"):
    out[layout] = load(tmp / f"two-{layout}")
  return out


def needs_orbax() -> None:
  """Orbax is part of the test install (the experiments extra): its absence is an error."""
  assert importlib.util.find_spec("orbax") is not None, "install the experiments extra"
