"""An Orbax checkpoint moves between 2 processes and 1 process with another mesh.

Training of the small decoder LM (`examples/multiprocess.py`) is checkpointed after 2
of 4 steps (params and optimizer state) by the shared runs of
tests/multiprocess_harness.py, and continues from the checkpoint on another topology
and layout; after 4 steps the parameters equal those of an uninterrupted, one-process,
unsharded run to float32 rounding:

* saved by 2 processes, mesh (data 2, model 2), heads and rows split; restored in 1
  process on a (data 1, model 2) mesh;
* saved by 1 process, mesh (data 2, model 1), rows split; restored by 2 processes,
  mesh (data 2, model 2), heads split.
"""

import pytest

from tests.multiprocess_harness import SAVE_STEP
from tests.multiprocess_harness import STEPS
from tests.multiprocess_harness import TOL
from tests.multiprocess_harness import finish
from tests.multiprocess_harness import load
from tests.multiprocess_harness import max_diff
from tests.multiprocess_harness import start

# Slow: the same paths as the default suite at full size (python -m pytest -m slow).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def restored(multiprocess_runs):
  tmp = multiprocess_runs["tmp"]
  rest = ["--first-step", str(SAVE_STEP), "--steps", str(STEPS - SAVE_STEP)]
  to1 = start(
    ["--layout", "both", "--mesh", "1x2", "--restore", str(tmp / "from2" / "both")]
    + ["--out", str(tmp / "to1")]
    + rest
  )
  to2 = start(
    ["--launch", "2", "--layout", "heads", "--restore", str(tmp / "from1" / "fsdp")]
    + ["--out", str(tmp / "to2")]
    + rest
  )
  for proc in (to1, to2):
    code, text = finish(proc)
    assert code == 0, text[-4000:]
  return {name: load(tmp / name) for name in ("to1", "to2")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
  "name,processes,mesh",
  [("to1", 1, {"data": 1, "model": 2}), ("to2", 2, {"data": 2, "model": 2})],
  ids=["2-processes-to-1", "1-process-to-2"],
)
def test_restored_run_continues_like_an_uninterrupted_one(
  multiprocess_runs, restored, name, processes, mesh
):
  ref, ref_info = multiprocess_runs["ref"]
  params, info = restored[name]
  assert info["processes"] == processes and info["mesh"] == mesh, info
  assert max_diff(params, ref) <= TOL, max_diff(params, ref)
  assert info["isometry"] <= 2e-6, info
  assert info["losses"] == pytest.approx(ref_info["losses"][SAVE_STEP:], rel=1e-6)
