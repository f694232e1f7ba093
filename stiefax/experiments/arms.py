"""The arms of every experiment command: one registry, one meaning per name.

An arm says how the query/key frames W_Q, W_K are trained (``frames``: the frame rule
and its keyword arguments ``options``), where they start (``orthonormal``) and, for a
few arms, what they change in the rest of the model (circuit weight decay, circuit
init scale, the soft orthogonality penalty) or how the attention reads them
(``attention``: plain, QK-norm or σReparam, :mod:`stiefax.experiments.attention`). The rates and the other hyperparameters
come from the experiment's setting; :mod:`stiefax.experiments.optim` builds the
optimizer. Each command offers a subset (:func:`select`), in its own order.

Frame rules (``Arm.frames``):

  adamw            no separate rule: W_Q, W_K are ordinary AdamW parameters (decayed)
  adam             plain Adam on W_Q, W_K at the AdamW rate (no decay, no constraint)
  riemannian_adam  stiefax.riemannian_adam (the paper's B2 and its ablations)
  riemannian_sgd   stiefax.riemannian_sgd (PA16)
  manifold_muon    stiefax.manifold_muon
  muon             optax.contrib.muon, one matrix per head, decayed, unconstrained
  zero             optax.set_to_zero: W_Q, W_K never move

Matrix rules (``Arm.matrices``, ``stiefax lm``): how every other hidden matrix (the
attention and MLP projections; W_Q, W_K too when ``frames`` is ``adamw``) trains;
embeddings, norm scales and other vectors stay with AdamW:

  adamw            AdamW with the rest (the default)
  adamh            stiefax.adamh: the published Hyperball over Adam, no decay
  muonh            stiefax.muonh: the published Hyperball over Muon, no decay
  muon             optax.contrib.scale_by_muon, decayed, unconstrained
  sphere_adam      stiefax.sphere.sphere_adam: the Riemannian sphere Adam, no decay
"""

from __future__ import annotations

import dataclasses
import types
from typing import Iterable
from typing import Mapping
from typing import Optional

__all__ = [
  "FRAME_RULES",
  "MATRIX_RULES",
  "ATTENTION",
  "QK_INPUTS",
  "Arm",
  "ARMS",
  "ALIASES",
  "select",
  "lookup",
]

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
    description: one line; ``stiefax patches`` records it in every run's configuration
      (part of the run's hash), so it stays fixed.
    frames: the frame rule, one of :data:`FRAME_RULES`.
    options: keyword arguments of the frame rule (they override the setting's).
    orthonormal: W_Q, W_K start on St(d, r) (else at the model's default init).
    rate: the frame rule's default rate; ``None``: the AdamW rate.
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
  """

  name: str
  description: str
  frames: str
  options: Mapping = dataclasses.field(default_factory=_frozen, hash=False)
  orthonormal: bool = True
  rate: Optional[float] = None
  grid: tuple[float, ...] = ()
  penalty: bool = False
  weight_decay: Optional[float] = None
  circuit_init_scale: float = 1.0
  attention: str = "plain"
  temperature: bool = False
  qk_input: str = "gained"
  frame_gain: bool = False
  matrices: str = "adamw"

  def __post_init__(self) -> None:
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

  @property
  def apart(self) -> bool:
    """W_Q, W_K have their own rule (``stiefax.stiefel_adamw``), not the AdamW of the rest."""
    return self.frames != "adamw"


_ADAMW_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
_RADAM_GRID = (0.3, 1.0, 3.0)
_FLOAT32_EPS = 1e-8  # riemannian_adam's own eps, kept where a rule ignores the setting's

ARMS: Mapping[str, Arm] = types.MappingProxyType(
  {
    a.name: a
    for a in (
      Arm("A2", "AdamW + Xavier", "adamw", orthonormal=False, grid=_ADAMW_GRID),
      Arm("A2-orth", "AdamW, orthonormal W_Q, W_K init", "adamw", grid=_ADAMW_GRID),
      Arm(
        "A2-qknorm",
        "AdamW + Xavier, QK-norm (LayerNorm on each head's q and k, learned scale)",
        "adamw",
        orthonormal=False,
        grid=_ADAMW_GRID,
        attention="qknorm",
      ),
      Arm(
        "A2-sigma",
        "AdamW + Xavier, sigmaReparam W_Q, W_K (gamma W / sigma(W))",
        "adamw",
        orthonormal=False,
        grid=_ADAMW_GRID,
        attention="sigma",
      ),
      Arm(
        "B2",
        "Riemannian Adam (Stiefel projector, scalar v)",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
      ),
      Arm(
        "B2-qknorm",
        "B2 + QK-norm (LayerNorm on each head's q and k, learned scale)",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
        attention="qknorm",
      ),
      Arm(
        "B2-temp",
        "B2 + a learned temperature per head (exp(t_h) q·k / sqrt(r), t_h init 0)",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
        temperature=True,
      ),
      Arm(
        "B2-fold",
        "B2-temp, W_Q and W_K read x / rms(x) without the norm's gain",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
        temperature=True,
        qk_input="fold",
      ),
      Arm(
        "A2-temp",
        "AdamW + Xavier + a learned temperature per head (exp(t_h) q·k / sqrt(r))",
        "adamw",
        orthonormal=False,
        grid=_ADAMW_GRID,
        temperature=True,
      ),
      Arm(
        "B2-diag",
        "B2 on U_h, each head U_h diag(g_h) with a learned gain g_h (init 1)",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
        frame_gain=True,
      ),
      # Study 3 (docs/lm.md): constant-norm matrices.
      Arm(
        "AdamH",
        "AdamH (Hyperball over Adam) on every hidden matrix, AdamW on the rest",
        "adamw",
        orthonormal=False,
        matrices="adamh",
      ),
      Arm(
        "AdamH-qknorm",
        "AdamH + QK-norm (LayerNorm on each head's q and k, learned scale)",
        "adamw",
        orthonormal=False,
        attention="qknorm",
        matrices="adamh",
      ),
      Arm(
        "Muon",
        "Muon (optax.contrib, decayed) on every hidden matrix, AdamW on the rest",
        "adamw",
        orthonormal=False,
        matrices="muon",
      ),
      Arm(
        "MuonH",
        "MuonH (Hyperball over Muon) on every hidden matrix, AdamW on the rest",
        "adamw",
        orthonormal=False,
        matrices="muonh",
      ),
      Arm(
        "B2-H",
        "B2 on the W_Q, W_K frames, AdamH on every other hidden matrix",
        "riemannian_adam",
        rate=1.0,
        grid=_RADAM_GRID,
        matrices="adamh",
      ),
      Arm(
        "SphereAdam",
        "Riemannian sphere Adam on every hidden matrix, AdamW on the rest",
        "adamw",
        orthonormal=False,
        matrices="sphere_adam",
      ),
      Arm(
        "B2-SGD",
        "Riemannian SGD, Grassmann projector (PA16)",
        "riemannian_sgd",
        {"projector": "grassmann"},
        rate=0.02,
        grid=(0.005, 0.02, 0.05),
      ),
      Arm("frozen", "Riemannian arm at rate 0", "riemannian_adam", rate=0.0, grid=(0.0,)),
      Arm(
        "elementwise",
        "Riemannian Adam, elementwise v",
        "riemannian_adam",
        {"moment": "elementwise"},
        rate=0.03,
        grid=(0.01, 0.03, 0.1),
      ),
      Arm(
        "grassmann",
        "Riemannian Adam, Grassmann projector",
        "riemannian_adam",
        {"projector": "grassmann"},
        rate=1.0,
        grid=_RADAM_GRID,
      ),
      Arm(
        "soft",
        "AdamW + lambda ||W^T W - I||_F^2",
        "adamw",
        orthonormal=False,
        grid=(0.01, 0.1, 1.0),
        penalty=True,
      ),
      Arm(
        "B2m",
        "tangent projection + elementwise Adam at the AdamW rate, no cap",
        "riemannian_adam",
        {"moment": "elementwise", "max_norm": None, "eps": _FLOAT32_EPS},
      ),
      Arm(
        "B2m-can",
        "B2m with the canonical gradient",
        "riemannian_adam",
        {"moment": "elementwise", "max_norm": None, "eps": _FLOAT32_EPS, "projector": "canonical"},
      ),
      Arm("B2-frz", "W_Q, W_K frozen at orthonormal init", "zero"),
      Arm("A2-nwf", "A2 without decay on W_Q, W_K", "adam", orthonormal=False),
      Arm("B2-hi", "B2 with circuit decay 2.0", "riemannian_adam", rate=1.0, weight_decay=2.0),
      Arm(
        "B2-sn", "B2 with circuit init 0.1x", "riemannian_adam", rate=1.0, circuit_init_scale=0.1
      ),
      Arm(
        "B2-comb",
        "B2-hi + B2-sn",
        "riemannian_adam",
        rate=1.0,
        weight_decay=2.0,
        circuit_init_scale=0.1,
      ),
      Arm(
        "B2-mmuon",
        "manifold Muon (spectral-norm steepest descent on St)",
        "manifold_muon",
        rate=0.05,
        grid=(0.02, 0.05, 0.1),
      ),
      Arm(
        "A2-muon",
        "optax.contrib.muon on W_Q, W_K, unconstrained",
        "muon",
        orthonormal=False,
        rate=0.02,
        grid=(0.005, 0.02, 0.05),
      ),
      Arm(
        "B2-qr",
        "Riemannian Adam, QR retraction",
        "riemannian_adam",
        {"retraction": "qr"},
        rate=1.0,
        grid=_RADAM_GRID,
      ),
      Arm(
        "B2-cayley",
        "Riemannian Adam, Cayley retraction",
        "riemannian_adam",
        {"retraction": "cayley"},
        rate=1.0,
        grid=_RADAM_GRID,
      ),
    )
  }
)

#: Other spellings accepted on the command line (case, "-" and "_" are ignored too).
ALIASES: Mapping[str, str] = types.MappingProxyType(
  {
    "pa16": "B2-SGD",
    "b2sgd": "B2-SGD",
    "a2orth": "A2-orth",
    "soft-penalty": "soft",
    "penalty": "soft",
    "grassmann-adam": "grassmann",
    "elem": "elementwise",
    "qknorm": "A2-qknorm",
    "sigma": "A2-sigma",
    "sigmareparam": "A2-sigma",
  }
)


def select(names: Iterable[str]) -> Mapping[str, Arm]:
  """The arms ``names`` of the registry, in that order (read-only)."""
  return types.MappingProxyType({n: ARMS[n] for n in names})


def lookup(name: str, offered: Mapping[str, Arm]) -> Optional[Arm]:
  """The arm of ``offered`` that ``name`` spells (any case, or an alias), else None."""
  key = name.strip()
  for k, arm in offered.items():
    if k.lower() == key.lower():
      return arm
  alias = ALIASES.get(key.lower().replace("_", "-")) or ALIASES.get(
    key.lower().replace("-", "").replace("_", "")
  )
  return offered.get(alias) if alias else None
