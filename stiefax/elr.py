"""The effective learning rate of an update: radial and tangential parts, angle.

For an update ``Delta = w_{t+1} - w_t`` of a parameter
(or a frame) ``w = w_t``, split ``Delta`` into its radial and tangential parts::

    radial     = <Delta, w> / ||w||^2
    tangential = ||Delta - radial w|| / ||w||        (the effective learning rate)
    angle      = angle(w_t, w_{t+1}) = atan2(tangential, 1 + radial)

The tangential part keeps the inner product ``<Delta, w>`` instead of assuming it is
zero; with ``<Delta, w> = 0`` it is the usual ``||Delta|| / ||w||``.
:func:`effective_learning_rate`, :func:`angular_update` and :func:`update_summary`
are pure ``jnp`` and run inside jitted training loops.

``per=`` chooses what one value is measured over: ``"leaf"`` (the default of
:func:`effective_learning_rate` and :func:`angular_update`) takes each leaf whole,
``"frame"`` takes each frame, read with ``frames=`` (``None``: by the leaf's name,
as everywhere in stiefax; see :func:`stiefax.layouts.resolve_frames`). A frame is
measured on :meth:`stiefax.FrameSpec.view` over :meth:`stiefax.FrameSpec.frame_axes`,
so specs that ``split`` a fused leaf (a Llama ``q_proj``, a GPT-2 ``c_attn``) or
``select`` part of it (a Gemma ``kv_einsum``) give one value per selected frame.
"""

from stiefax._elr import ELR
from stiefax._elr import ReferenceELR
from stiefax._elr import angular_update
from stiefax._elr import effective_learning_rate
from stiefax._elr import reference_elr_schedule
from stiefax._elr import update_summary

__all__ = [
  "ELR",
  "effective_learning_rate",
  "angular_update",
  "update_summary",
  "reference_elr_schedule",
  "ReferenceELR",
]
