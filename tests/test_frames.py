import jax.numpy as jnp
import numpy as np
import pytest

from stiefax import FrameSpec


@pytest.mark.parametrize(
  "spec, shape, expected",
  [
    (FrameSpec(), (16, 4), ((), 16, 4)),
    (FrameSpec(), (16, 3, 4), ((3,), 16, 4)),
    (FrameSpec(col_axes=(-2, -1)), (16, 3, 4), ((), 16, 12)),
    (FrameSpec(row_axis=1), (2, 16, 3, 4), ((2, 3), 16, 4)),
    (FrameSpec(row_axis=-1, col_axes=(0,)), (4, 16), ((), 16, 4)),
  ],
)
def test_frame_shape_and_round_trip(spec, shape, expected):
  assert spec.frame_shape(shape) == expected
  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  f = spec.to_frames(x)
  assert f.shape == expected[0] + expected[1:]
  np.testing.assert_array_equal(spec.from_frames(f, shape), x)


def test_frames_index_the_right_entries():
  x = jnp.arange(16 * 3 * 4).reshape(16, 3, 4)
  f = FrameSpec().to_frames(x)
  # Frame h is the kernel slice [:, h, :].
  np.testing.assert_array_equal(f[1], x[:, 1, :])
  b = FrameSpec(col_axes=(-2, -1)).to_frames(x)
  np.testing.assert_array_equal(b[:, 4:8], x[:, 1, :])
  s = FrameSpec(row_axis=1).to_frames(jnp.stack([x, 2 * x]))
  np.testing.assert_array_equal(s[1, 2], 2 * x[:, 2, :])


def test_r_greater_than_d_names_the_shape():
  with pytest.raises(ValueError, match=r"\(4, 8\).*r <= d"):
    FrameSpec().frame_shape((4, 8))
  with pytest.raises(ValueError, match=r"heads \* head_dim <= d_model"):
    FrameSpec(col_axes=(-2, -1)).frame_shape((16, 4, 8))


def test_missing_axis_is_a_clear_error():
  with pytest.raises(ValueError, match="does not exist for an array of rank 2"):
    FrameSpec(row_axis=2).frame_shape((16, 4))
  with pytest.raises(ValueError, match="distinct"):
    FrameSpec(row_axis=0, col_axes=(0,)).frame_shape((16, 4))
  with pytest.raises(ValueError, match="at least one"):
    FrameSpec(col_axes=())


def test_is_contiguous_says_when_to_frames_is_a_reshape():
  for spec, shape, contiguous in [
    (FrameSpec(), (12, 3, 4), False),  # (d, H, r): heads between rows and columns
    (FrameSpec(row_axis=-2), (3, 12, 4), True),  # (..., d, r)
    (FrameSpec(row_axis=1, col_axes=(-2, -1)), (2, 12, 3, 4), True),  # block frames
    (FrameSpec(row_axis=1), (2, 12, 3, 4), False),  # (L, d, H, r) per-head frames
  ]:
    x = jnp.arange(float(np.prod(shape))).reshape(shape)
    assert spec.is_contiguous(x.ndim) == contiguous
    batch, d, r = spec.frame_shape(shape)
    as_reshape = np.array_equal(spec.to_frames(x), x.reshape(batch + (d, r)))
    assert as_reshape == contiguous


@pytest.mark.parametrize(
  "spec, shape, expected, index",
  [
    # Dense (d, H r): heads split out of the column axis.
    (FrameSpec(split=(1, (3, -1))), (16, 12), ((3,), 16, 4), lambda x: x.reshape(16, 3, 4)),
    # Fused (3, H, d, r): q and k slices; non-contiguous q and v too.
    (FrameSpec(row_axis=2, select=(0, (0, 1))), (3, 2, 16, 4), ((2, 2), 16, 4), lambda x: x[:2]),
    (
      FrameSpec(row_axis=2, select=(0, (2, 0))),
      (3, 2, 16, 4),
      ((2, 2), 16, 4),
      lambda x: x[np.array([2, 0])],
    ),
    # GPT-2 (d, 3 H r): split, then select the q and k thirds.
    (
      FrameSpec(split=(1, (3, 2, -1)), select=(1, (0, 1))),
      (16, 24),
      ((2, 2), 16, 4),
      lambda x: x.reshape(16, 3, 2, 4)[:, :2],
    ),
  ],
)
def test_split_and_select_view_the_right_entries(spec, shape, expected, index):
  assert spec.frame_shape(shape) == expected
  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) + 1
  f = spec.to_frames(x)
  assert f.shape == expected[0] + expected[1:]
  # The frames hold exactly the selected entries, each once.
  np.testing.assert_array_equal(np.sort(np.ravel(f)), np.sort(np.ravel(index(x))))
  back = spec.from_frames(f, shape)
  if spec.select is None:
    np.testing.assert_array_equal(back, x)
  else:
    kept = np.asarray(back) != 0
    np.testing.assert_array_equal(np.asarray(back)[kept], np.asarray(x)[kept])
    assert kept.sum() == f.size  # the unselected entries are zero
    np.testing.assert_array_equal(spec.from_frames(f, shape, spec.rest(x)), x)


@pytest.mark.parametrize(
  "spec, shape, match",
  [
    (FrameSpec(split=(1, (5, -1))), (16, 12), "not a multiple of 5"),
    (FrameSpec(split=(1, (5, 3))), (16, 12), "product 15"),
    (FrameSpec(row_axis=2, select=(0, (3,))), (3, 2, 16, 4), "has size 3"),
    (FrameSpec(row_axis=2, select=(2, (0,))), (3, 2, 16, 4), "select only along a batch axis"),
  ],
)
def test_split_and_select_errors(spec, shape, match):
  with pytest.raises(ValueError, match=match):
    spec.frame_shape(shape)


def test_split_and_select_arguments_are_validated():
  with pytest.raises(ValueError, match="at most one -1"):
    FrameSpec(split=(1, (-1, -1)))
  with pytest.raises(ValueError, match="distinct"):
    FrameSpec(select=(0, (1, 1)))
  with pytest.raises(ValueError, match=r"\(axis, \(int, \.\.\.\)\)"):
    FrameSpec(select=(0,))
  assert repr(FrameSpec()) == "FrameSpec(row_axis=0, col_axes=(-1,))"
  assert FrameSpec(select=(0, 1)).select == (0, (1,))
