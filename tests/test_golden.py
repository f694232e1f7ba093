"""Every public optimizer and transform reproduces its frozen float64 trajectory."""

import jax
import numpy as np
import pytest

from tests import cases as common
from tests import golden


@pytest.fixture(scope="module")
def frozen():
  with np.load(golden.PATH) as z:
    return dict(z)


@pytest.mark.parametrize("name", common.NAMES)
def test_float64_trajectory_is_unchanged(frozen, name):
  with jax.enable_x64(True):
    now = golden.trajectory(name)
  want = {k.split("|", 1)[1]: v for k, v in frozen.items() if k.split("|", 1)[0] == name}
  assert want, f"{name}: no frozen trajectory; regenerate with python -m tests.golden"
  assert sorted(now) == sorted(want), name
  for k, v in want.items():
    assert now[k].dtype == v.dtype and now[k].shape == v.shape, (name, k)
    np.testing.assert_allclose(now[k], v, rtol=0, atol=1e-12, err_msg=f"{name} {k}")
