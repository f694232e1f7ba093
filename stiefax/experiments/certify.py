"""Float64 certificates of the paper's propositions (its Table 10).

Runs every check of :mod:`stiefax.certificates` on the shipped code and prints one
row per check: its name, the proposition, the residual of the claim, the tolerance,
the control (the same statistic where the claim must fail) and PASS/FAIL. Exits 1 if
any check fails. ``--json`` writes a new file (atomically); an existing one is refused
unless ``--force``, which moves it aside.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any
from typing import Sequence

from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import check_seeds


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--seed", type=int, default=0, help="random draw of every check")
  parser.add_argument(
    "--only",
    action="append",
    default=None,
    metavar="CHECK",
    help="run only this check (repeatable); names as in the table",
  )
  parser.add_argument(
    "--json",
    default=None,
    metavar="PATH",
    help="also write the records as JSON (a new file; see --force)",
  )
  parser.add_argument(
    "--force",
    action="store_true",
    help="replace an existing --json file (it is moved aside to <name>.replaced-<time>-<pid>)",
  )


def format_table(results: Sequence[Any]) -> str:
  """The certificates as a fixed-width text table."""
  header = (
    f"{'check':32s} {'proposition':12s} {'residual':>10s} {'tolerance':>10s}"
    f" {'control':>10s}  result"
  )
  lines = [header, "-" * len(header)]
  for c in results:
    lines.append(
      f"{c.name:32s} {c.proposition:12s} {c.residual:10.2e} {c.tolerance:10.0e}"
      f" {c.control:10.2e}  {'PASS' if c.passed else 'FAIL'}"
    )
  return "\n".join(lines)


def _check_json(args: argparse.Namespace) -> None:
  """Refuses an existing ``--json`` file (before any check runs) unless ``--force``."""
  if args.json is None:
    return
  if not str(args.json).strip():
    raise CommandError("--json is empty; name a file (e.g. --json certificates.json).")
  path = pathlib.Path(args.json)
  if os.path.lexists(path) and not args.force:
    raise CommandError(
      f"--json {args.json}: the file exists; give --force to replace it (it is moved aside)."
    )
  if path.is_dir():
    raise CommandError(f"--json {args.json}: is a folder; name a file.")


def _write_json(args: argparse.Namespace, records: list) -> None:
  path = pathlib.Path(args.json)
  try:
    if os.path.lexists(path):  # --force: the earlier file is kept, renamed
      aside = store.move_aside(path, "replaced")
      print(f"stiefax certify: moved the earlier {path.name} to {aside.name}", file=sys.stderr)
    text = json.dumps(records, indent=2)
    store.atomic_write(path, lambda f: f.write(text), overwrite=False, binary=False)
  except OSError as e:
    raise CommandError(f"cannot write --json {args.json!r}: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> int:
  from stiefax import certificates  # JAX: here, not by `stiefax certify --help`

  check_seeds([args.seed], "--seed")
  _check_json(args)
  by_name = {f.__name__: f for f in certificates.CERTIFICATES}
  chosen = list(certificates.CERTIFICATES)
  if args.only:
    unknown = [n for n in args.only if n not in by_name]
    if unknown:
      raise CommandError(f"unknown check {unknown[0]!r}; valid checks are: {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.only]
  start = time.perf_counter()
  results = [cert(args.seed) for cert in chosen]
  elapsed = time.perf_counter() - start
  print(format_table(results))
  n_pass = sum(c.passed for c in results)
  print(f"\n{n_pass}/{len(results)} checks pass (float64, seed {args.seed}, {elapsed:.1f} s)")
  if args.json:
    _write_json(args, [c._asdict() for c in results])
  return 0 if n_pass == len(results) else 1
