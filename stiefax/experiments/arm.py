"""One arm of the registry (:mod:`stiefax.experiments.arms`): the fields of an entry.

Imports neither JAX nor Optax: the commands' ``--help`` reads the registry.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping
from typing import Optional

__all__ = ["COMMANDS", "FRAME_RULES", "MATRIX_RULES", "ATTENTION", "QK_INPUTS", "Arm"]

#: The commands that train arms.
COMMANDS = ("grok", "lm", "patches")

FRAME_RULES = (
  "adamw",
  "adam",
  "riemannian_adam",
  "riemannian_sgd",
  "manifold_muon",
  "muon",
  "zero",
)

#: How an arm trains the hidden matrices that are not its frames (``Arm.matrices``).
MATRIX_RULES = ("adamw", "adamh", "muonh", "muon", "sphere_adam")

#: How an arm's attention reads W_Q, W_K (:mod:`stiefax.experiments.attention`).
ATTENTION = ("plain", "qknorm", "sigma")

#: What an arm's W_Q, W_K read (``Arm.qk_input``).
QK_INPUTS = ("gained", "fold")


def _frozen(d: Optional[Mapping] = None) -> Mapping:
  return types.MappingProxyType(dict(d or {}))


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm.

  Attributes:
    name: the arm's name on every command line.
    description: one line: the arm's ``--help`` line in every command, and what its
      runs record (part of each run's hash, so it stays fixed once runs exist).
    commands: the commands that offer the arm (of :data:`COMMANDS`).
    frames: the frame rule, one of :data:`FRAME_RULES`.
    options: keyword arguments of the frame rule (they override the setting's).
    orthonormal: W_Q, W_K start on St(d, r) (else at the model's default init).
    frame_lr: the frame rule's default rate (``stiefel_learning_rate`` of
      ``stiefax.stiefel_adamw``); ``None``: the AdamW rate.
    grid: the rates a rate selection tries (``stiefax patches --select-lr``).
    penalty: adds ``lambda * ||W^T W - I||_F^2`` to the loss (``stiefax patches``).
    weight_decay: the circuit's decay (``None``: the setting's).
    circuit_init_scale: multiplies every non-frame matrix at init.
    attention: ``plain``, ``qknorm`` (LayerNorm on each head's q and k) or ``sigma``
      (σReparam on W_Q, W_K); see :mod:`stiefax.experiments.attention`.
    temperature: each head's logits are ``exp(t_h) q·k / sqrt(r)`` with a learned
      ``t_h`` per head and layer, init 0, trained by AdamW without decay (``stiefax lm``).
    qk_input: what W_Q, W_K read: ``gained``, the pre-attention norm's output
      ``x / rms(x) * (1 + s)``, or ``fold``, ``x / rms(x)`` without the learned gain
      (the values keep the gained input; ``stiefax lm``).
    frame_gain: each query/key head is ``U_h diag(g_h)``: ``U_h`` the frame, ``g_h`` in
      R^r a learned gain, init 1, trained by AdamW without decay (``stiefax lm``).
    matrices: the rule of the hidden matrices that are not frames, one of
      :data:`MATRIX_RULES`, at the setting's matrix rate (``stiefax lm``).
    base: the arm this one changes one thing of: the reports add the paired contrast
      arm - base (:func:`base_contrasts`) where a study's own list lacks it.
    recorded: ``{command: description}`` where a command's earlier runs recorded
      another description (their identities keep it); others record ``description``.
  """

  name: str
  description: str
  frames: str
  options: Mapping = dataclasses.field(default_factory=_frozen, hash=False)
  orthonormal: bool = True
  frame_lr: Optional[float] = None
  grid: tuple[float, ...] = ()
  penalty: bool = False
  weight_decay: Optional[float] = None
  circuit_init_scale: float = 1.0
  attention: str = "plain"
  temperature: bool = False
  qk_input: str = "gained"
  frame_gain: bool = False
  matrices: str = "adamw"
  commands: tuple[str, ...] = ()
  base: Optional[str] = None
  recorded: Mapping = dataclasses.field(default_factory=_frozen, hash=False)

  def __post_init__(self) -> None:
    unknown = [c for c in self.commands if c not in COMMANDS]
    if unknown:
      raise ValueError(
        f"Arm {self.name!r}: commands={self.commands!r} names {unknown[0]!r}; choose from"
        f" {', '.join(COMMANDS)}"
      )
    if self.matrices not in MATRIX_RULES:
      raise ValueError(
        f"Arm {self.name!r}: matrices={self.matrices!r}; choose from {', '.join(MATRIX_RULES)}"
      )
    if self.qk_input not in QK_INPUTS:
      raise ValueError(
        f"Arm {self.name!r}: qk_input={self.qk_input!r}; choose from {', '.join(QK_INPUTS)}"
      )
    if self.attention not in ATTENTION:
      raise ValueError(
        f"Arm {self.name!r}: attention={self.attention!r}; choose from {', '.join(ATTENTION)}"
      )
    if self.frames not in FRAME_RULES:
      raise ValueError(
        f"Arm {self.name!r}: frames={self.frames!r}; choose from {', '.join(FRAME_RULES)}"
      )
    object.__setattr__(self, "options", _frozen(self.options))
    object.__setattr__(self, "recorded", _frozen(self.recorded))

  @property
  def apart(self) -> bool:
    """W_Q, W_K have their own rule (``stiefax.stiefel_adamw``), not the AdamW of the rest."""
    return self.frames != "adamw"

  def description_in(self, command: str) -> str:
    """The description runs of ``command`` record (``recorded``, else ``description``)."""
    return self.recorded.get(command, self.description)
