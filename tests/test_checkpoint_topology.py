"""An Orbax checkpoint moves between 2 processes and 1 process with another mesh.

Training of the small decoder LM (`examples/multiprocess.py`) stops after 2 of 4 steps,
saves params and optimizer state, and continues on another topology and layout from
the checkpoint; after 4 steps the parameters equal those of an uninterrupted,
one-process, unsharded run to float32 rounding:

* 2 processes, mesh (data 2, model 2), heads and rows split, save; 1 process, mesh
  (data 1, model 2), restore, continue;
* 1 process, mesh (data 2, model 1), rows split, save; 2 processes, mesh (data 2,
  model 2), heads split, restore, continue.
"""

import pytest

from tests.test_multiprocess import TOL
from tests.test_multiprocess import _finish
from tests.test_multiprocess import _load
from tests.test_multiprocess import _max_diff
from tests.test_multiprocess import _skip_unless_started
from tests.test_multiprocess import _start

pytest.importorskip("orbax.checkpoint", reason="needs orbax-checkpoint (the experiments extra)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("checkpoint")
  first, second = ["--steps", "2"], ["--first-step", "2", "--steps", "2"]
  # The reference and both first halves, side by side.
  ref = _start(["--layout", "none", "--mesh", "1x1", "--steps", "4", "--out", str(tmp / "ref")])
  save2 = _start(["--launch", "2", "--layout", "both", "--save", str(tmp / "from2")] + first)
  save1 = _start(["--layout", "fsdp", "--mesh", "2x1", "--save", str(tmp / "from1")] + first)
  code, text = _finish(save2)
  _skip_unless_started(code, text)
  for proc in (ref, save1):
    code, text = _finish(proc)
    assert code == 0, text[-4000:]
  # The second halves on the other topology.
  restore1 = _start(
    [
      "--layout",
      "both",
      "--mesh",
      "1x2",
      "--restore",
      str(tmp / "from2"),
      "--out",
      str(tmp / "to1"),
    ]
    + second
  )
  restore2 = _start(
    [
      "--launch",
      "2",
      "--layout",
      "heads",
      "--restore",
      str(tmp / "from1"),
      "--out",
      str(tmp / "to2"),
    ]
    + second
  )
  for proc in (restore1, restore2):
    code, text = _finish(proc)
    assert code == 0, text[-4000:]
  return {name: _load(tmp / name) for name in ("ref", "to1", "to2")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
  "name,processes,mesh",
  [("to1", 1, {"data": 1, "model": 2}), ("to2", 2, {"data": 2, "model": 2})],
  ids=["2-processes-to-1", "1-process-to-2"],
)
def test_restored_run_continues_like_an_uninterrupted_one(runs, name, processes, mesh):
  ref, ref_info = runs["ref"]
  params, info = runs[name]
  assert info["processes"] == processes and info["mesh"] == mesh, info
  assert _max_diff(params, ref) <= TOL, _max_diff(params, ref)
  assert info["isometry"] <= 2e-6, info
  assert info["losses"] == pytest.approx(ref_info["losses"][2:], rel=1e-6)
