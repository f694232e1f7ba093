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
