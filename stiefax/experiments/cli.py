"""The ``stiefax`` command: ``stiefax <command> [options]``.

Each command lives in its own module of :mod:`stiefax.experiments`, which defines
``add_arguments(parser)`` and ``run(args) -> int``; it is imported only when used, so
``stiefax --help`` stays fast. A :class:`CommandError` raised by a command prints one
line (``stiefax <command>: error: ...``) and exits with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import tempfile
from typing import Sequence

# name -> (module, one-line help). Order is the order of `stiefax --help`.
COMMANDS = {
  "grok": ("stiefax.experiments.grok", "modular-arithmetic grokking (paper 4.3, 4.4)"),
  "patches": ("stiefax.experiments.patches", "image-patch benchmark (paper 3.3, 4.1-4.7)"),
  "lm": ("stiefax.experiments.lm", "decoder LM on real text: learning-rate sensitivity"),
  "report": ("stiefax.experiments.report", "tables and plots from a results directory"),
  "certify": ("stiefax.experiments.certify", "float64 certificates of the propositions"),
  "equivariance": ("stiefax.experiments.equivariance", "O(d)-equivariance table (paper Table 9)"),
  "covariance": ("stiefax.experiments.covariance", "covariance of optimizers under symmetries"),
}


class CommandError(Exception):
  """A user error: printed as one line, exit status 2."""


def writable_dir(path, what: str) -> pathlib.Path:
  """Creates ``path`` if needed and checks that a file can be written there.

  Raises:
    CommandError: ``"<what> <path>: cannot write there (<reason>)."``
  """
  out = pathlib.Path(path)
  try:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
      pass
  except OSError as e:
    raise CommandError(f"{what} {path}: cannot write there ({e.strerror or e}).") from None
  return out


def progress_bar(
  total: int,
  *,
  desc: str = "",
  unit: str = "it",
  enabled: bool = True,
  initial: int = 0,
  leave: bool = False,
):
  """The commands' progress bar (``tqdm``, on stderr): advance it with ``update(n)``.

  ``enabled=False`` gives a bar that prints nothing (``--no-progress``).
  """
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm(
    total=total,
    initial=initial,
    desc=desc,
    unit=unit,
    disable=not enabled,
    leave=leave,
    file=sys.stderr,
  )


def _available() -> dict:
  out = {}
  for name, (module, help_) in COMMANDS.items():
    spec = importlib.util.find_spec(module)
    if spec is not None:
      out[name] = (module, help_)
  return out


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
  from stiefax import __version__  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(
    prog="stiefax",
    description="Stiefel-manifold attention: experiments, reports and certificates.",
  )
  parser.add_argument(
    "--version",
    action="version",
    version=f"stiefax {__version__}",
    help="print the installed stiefax version and exit",
  )
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True
  parsers = {}
  for name, (module, help_) in _available().items():
    parsers[name] = (sub.add_parser(name, help=help_, description=help_), module)
  return parser, parsers


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser, parsers = build_parser()
  # Only the chosen command's module is imported (and adds its arguments).
  name = next((a for a in argv if not a.startswith("-")), None)
  if name in parsers:
    sub_parser, module = parsers[name]
    mod = importlib.import_module(module)
    mod.add_arguments(sub_parser)
  args = parser.parse_args(argv)
  sub_parser, module = parsers[args.command]
  mod = importlib.import_module(module)
  try:
    return int(mod.run(args) or 0)
  except CommandError as e:
    print(f"stiefax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"stiefax {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  # Run through the package module so commands raise the CommandError caught above.
  from stiefax.experiments import cli as _cli  # pylint: disable=g-import-not-at-top

  sys.exit(_cli.main())
