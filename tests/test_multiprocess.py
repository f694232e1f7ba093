"""Two real processes (jax.distributed, CPU collectives) train like one unsharded process.

`examples/multiprocess.py --launch 2` starts two processes with two CPU devices each
and a local coordinator; together they train the small decoder LM with
`stiefel_adamw` on a (data 2, model 2) mesh with W_Q, W_K split by heads, by rows
(FSDP) or both. A one-process, one-device run of the same script is the reference
(the runs: tests/multiprocess_harness.py).
"""

import numpy as np
import pytest

from tests.multiprocess_harness import LAYOUTS
from tests.multiprocess_harness import TOL
from tests.multiprocess_harness import max_diff

# Slow: the two-process runs (the session fixture) take about 100 s of a loaded core, and
# the slow suite builds them anyway for tests/test_checkpoint_topology.py.
pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_processes_match_one_unsharded_process(multiprocess_runs, layout):
  ref, ref_info = multiprocess_runs["ref"]
  params, info = multiprocess_runs[layout]
  assert info["processes"] == 2 and info["mesh"] == {"data": 2, "model": 2}, info
  assert max_diff(params, ref) <= TOL, (layout, max_diff(params, ref))
  assert info["isometry"] <= 2e-6, info
  np.testing.assert_allclose(info["losses"], ref_info["losses"], rtol=1e-6)


@pytest.mark.timeout(600)
def test_one_process_row_sharded_matches_too(multiprocess_runs):
  ref, _ = multiprocess_runs["ref"]
  params, info = multiprocess_runs["one-fsdp"]
  assert info["processes"] == 1 and info["mesh"] == {"data": 2, "model": 1}, info
  assert max_diff(params, ref) <= TOL


@pytest.mark.timeout(600)
def test_control_a_diverging_shard_is_caught(multiprocess_runs):
  ref, _ = multiprocess_runs["ref"]
  params, _ = multiprocess_runs["fsdp-perturbed"]
  assert max_diff(params, ref) > 10 * TOL


@pytest.mark.timeout(600)
def test_head_sharded_update_has_no_collectives(multiprocess_runs):
  comm = multiprocess_runs["heads"][1]["collectives"]
  assert all(v["count"] == 0 for v in comm.values()), comm


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ("fsdp", "both"))
def test_row_sharded_update_reduces_grams_and_gathers_nothing(multiprocess_runs, layout):
  comm = multiprocess_runs[layout][1]["collectives"]
  assert comm["all-gather"]["count"] == 0, comm
  assert comm["all-to-all"]["count"] == 0, comm
  assert comm["all-reduce"]["count"] > 0, comm
