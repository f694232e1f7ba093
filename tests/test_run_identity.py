"""Run identities are frozen: configurations, hashes, file names and commands.

Runs written by earlier versions of the code must be recognised as the same runs (so
a study resumes, skips finished runs and pairs them in its report). Two pins:

* real run files (``tests/data/runs``, copied from the image-patch study): the
  configuration rebuilt from the file's recorded ``command`` through the command-line
  parser equals the recorded one, field for field and in order, and gives the file's
  name and the same command;
* ``tests/data/run_identities.json``: the names, hashes and commands an earlier
  version gave for every arm and protocol of ``stiefax patches`` (two data sets) and
  every arm, preset and budget of ``stiefax grok``.
"""

import importlib
import json
import math
import pathlib
import shlex

import pytest

from stiefax.experiments import cli
from stiefax.experiments import flags
from stiefax.experiments import store
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.patches import command as patches_command
from stiefax.experiments.patches import config
from stiefax.experiments.patches import protocols
from stiefax.experiments.patches import runs

DATA = pathlib.Path(__file__).parent / "data"
RUN_FILES = sorted((DATA / "runs").glob("*.json"))
GOLDEN = json.loads((DATA / "run_identities.json").read_text())


def _parse(command: str):
  argv = shlex.split(command)
  assert argv[0] == "stiefax"
  parser, parsers = cli.build_parser()
  sub, module = parsers[argv[1]]
  importlib.import_module(module).add_arguments(sub)
  return parser.parse_args(argv[1:])


def _patches_config(command: str, protocol: str, facts: runs.DataFacts) -> tuple[dict, str]:
  """``(config, out)`` of the one run that ``command`` reruns, as the protocols build it."""
  args = _parse(command)
  dflt = patches_command.defaults(args)
  (arm,) = patches_command.select_arms(args)
  if protocol == "sweep-n":
    (n_train,) = flags.ints(args.ns, "--ns")
    epochs = max(1, args.budget // math.ceil(n_train / args.batch_size))
  else:
    n_train, epochs = dflt["n_train"], args.epochs
  eps = None
  if protocol == "sweep-eps":
    (eps,) = flags.floats(args.eps_values, "--eps-values")
  setting = protocols.make_setting(args, dflt, n_train, epochs, eps=eps)
  knobs = {k: flags.knob(v, "--lr") for k, v in protocols.arm_map(args.lr, "--lr").items()}
  hp = config.arm_hparams(arm, setting, knobs.get(arm.name))
  cfg = runs.run_config(
    protocol,
    arm,
    setting,
    hp,
    facts,
    data=args.data,
    patch=dflt["patch"],
    whiten_eps=args.whiten_eps,
    pca_samples=args.pca_samples,
    order_seed=args.order_seed,
    eval_split="val" if protocol == "select-lr" else "test",
  )
  return cfg, args.out


def _facts(cfg: dict) -> runs.DataFacts:
  return runs.DataFacts(**{k: cfg[k] for k in runs.DataFacts.__dataclass_fields__})


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_recorded_runs_rebuild_from_their_command(path):
  rec = json.loads(path.read_text())
  cfg, out = _patches_config(rec["command"], rec["config"]["protocol"], _facts(rec["config"]))
  assert json.dumps(cfg) == json.dumps(rec["config"])  # same fields, values and order
  assert runs.run_name(rec["config"]["protocol"], rec["arm"], cfg, rec["seed"]) == path.name
  assert runs.run_key(rec) == runs.run_key({**rec, "config": cfg})
  assert (
    runs.run_command(rec["config"]["protocol"], rec["arm"], cfg, rec["seed"], out)
    == (rec["command"])
  )


def test_a_changed_setting_changes_the_name():
  """Control: the pin would notice a change of any recorded field."""
  rec = json.loads(RUN_FILES[0].read_text())
  for key in ("adamw_lr", "description", "frame_init", "pca_fit_patches", "eps"):
    cfg = {**rec["config"], key: "changed"}
    assert runs.run_name("run", rec["arm"], cfg, rec["seed"]) != RUN_FILES[0].name, key
  cfg = {**rec["config"], "data": "/elsewhere/cifar.tar.gz"}  # where the data was read from
  assert runs.run_name("run", rec["arm"], cfg, rec["seed"]) == RUN_FILES[0].name


@pytest.mark.parametrize("i", range(len(GOLDEN["patches"])))
def test_patches_names_and_commands_are_unchanged(i):
  case = GOLDEN["patches"][i]
  cfg, out = _patches_config(case["command"], case["protocol"], runs.DataFacts(**case["facts"]))
  args = _parse(case["command"])
  seed = int(args.seeds)
  assert runs.run_name(case["protocol"], args.arms, cfg, seed) == case["name"]
  assert runs.run_command(case["protocol"], args.arms, cfg, seed, out) == case["command"]


def test_the_golden_cases_cover_every_arm_and_protocol():
  assert {c["protocol"] for c in GOLDEN["patches"]} == {"run", "select-lr", "sweep-n", "sweep-eps"}
  assert {_parse(c["command"]).arms for c in GOLDEN["patches"]} == set(config.ARMS)
  assert {c["name"].split("-")[0] for c in GOLDEN["grok"]} >= {"A2", "B2"}
  assert {_parse(c["command"]).arms for c in GOLDEN["grok"]} == set(grok_config.ARMS)


@pytest.mark.parametrize("i", range(len(GOLDEN["grok"])))
def test_grok_names_ids_and_commands_are_unchanged(i):
  case = GOLDEN["grok"][i]
  args = _parse(case["command"])
  config, (arm,), (seed,) = grok_command.resolve_config(args)
  assert grok_runs.run_file_name(config, arm, seed, args.preset, args.stabilize) == case["name"]
  assert store.digest(grok_runs.run_identity(config, arm, args.preset)) == case["run_id"]
  assert (
    grok_runs.run_command(config, arm, seed, args.preset, args.stabilize, args.out)
    == (case["command"])
  )


def test_the_paper_grok_runs_keep_their_files():
  """The paper-scale study's runs (and their checkpoints, ``<run>.ckpt``)."""
  assert (
    grok_runs.run_file_name(grok_config.PAPER, "A2", 0, "paper")
    == "A2-paper-e20000-b229e9d2-s0.json"
  )
