"""The communication table: a head-sharded update sends nothing, a row-sharded one no W."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("group_frames", ["off", "on"])
def test_comm_table_heads_send_nothing_and_rows_reduce_only_grams(group_frames):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  # Two layers: grouped, each layer's query kernels form one group and key kernels another.
  args = ["--d", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--layers", "2"]
  args += ["--group-frames", group_frames]
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.comm_table", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=220,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {
    line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
    for line in proc.stdout.splitlines()
    if line.startswith("| ") and not line.startswith("| layout")
  }
  # Columns: all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all, bytes.
  assert rows["heads"] == ["0"] * 5 + ["0"], rows
  for layout in ("fsdp", "both"):
    assert rows[layout][0] != "0" and rows[layout][1:5] == ["0"] * 4, rows
  assert rows["gather"][1] != "0", rows  # the naive reference gathers W
  fsdp, gather = (int(rows[k][-1].replace(",", "")) for k in ("fsdp", "gather"))
  assert fsdp < gather / 4, rows
