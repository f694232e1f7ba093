"""Frames are independent: a head-sharded update needs no cross-device communication.

The update runs on two layers of query/key kernels, which the fused update stacks into
one group: the grouping itself must add no collective.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(mode, layout="heads"):
  env = dict(os.environ)
  env["XLA_FLAGS"] = (
    env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  ).strip()
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run(
    [sys.executable, "-m", "tests.sharded_update", mode, layout],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=220,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
def test_head_sharded_update_equals_unsharded_without_collectives():
  result = _run("capped")
  assert result["diff"] <= 1e-6, result
  assert result["collectives"] == [], result
  assert "heads" in result["sharding"], result
  assert result["iso"] <= 2e-5, result
  # The state built from sharded params: moments like the kernels, per-frame leaves
  # along the heads.
  assert result["state_shardings"] == ["P('heads',)", "P(None, 'heads', None)"], result


@pytest.mark.timeout(240)
def test_control_a_global_stopping_rule_does_communicate():
  result = _run("uncapped")
  assert result["diff"] <= 1e-5, result
  assert "all-reduce" in result["collectives"], result


@pytest.mark.timeout(240)
def test_row_sharded_grouped_update_gathers_nothing():
  result = _run("capped", "rows")
  assert result["diff"] <= 1e-5, result
  # The rows' partial Gram products are summed (all-reduce); no frame is gathered.
  assert "all-gather" not in result["collectives"], result
  assert set(result["collectives"]) <= {"all-reduce"}, result
