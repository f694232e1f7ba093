"""The library's module graph: no import cycles, no reaching into private names."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "stiefax"
# The library modules (the experiment harness and the certificates have their own rules).
LIBRARY = sorted(
  p.stem
  for p in PACKAGE.glob("*.py")
  if p.stem not in ("__init__", "certificates") and not p.stem.startswith("test")
)


def _tree(name):
  return ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))


def _imports(name):
  """``{module: alias}`` of the stiefax modules that ``name`` imports, anywhere in it."""
  found = {}
  for node in ast.walk(_tree(name)):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stiefax"):
      if node.module == "stiefax":
        for a in node.names:
          found[a.name] = a.asname or a.name
      else:
        found[node.module.split(".")[1]] = None
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.startswith("stiefax."):
          found[a.name.split(".")[1]] = a.asname
  return found


def test_library_modules_form_no_import_cycle():
  graph = {m: set(_imports(m)) & set(LIBRARY) for m in LIBRARY}
  done, stack = set(), []

  def visit(m):
    if m in stack:
      pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m) :] + [m]))
    if m in done:
      return
    stack.append(m)
    for n in sorted(graph[m]):
      visit(n)
    stack.pop()
    done.add(m)

  for m in LIBRARY:
    visit(m)


def test_labels_is_a_leaf_module():
  assert not set(_imports("labels")), _imports("labels")


def test_imports_are_at_module_level():
  for m in LIBRARY:
    tree = _tree(m)
    top = {id(n) for n in tree.body}
    lazy = [
      n.lineno
      for n in ast.walk(tree)
      if isinstance(n, ast.ImportFrom)
      and (n.module or "").startswith("stiefax")
      and id(n) not in top
    ]
    assert not lazy, f"stiefax/{m}.py imports stiefax modules inside functions (lines {lazy})"


@pytest.mark.parametrize("name", LIBRARY)
def test_no_module_uses_another_modules_private_names(name):
  tree = _tree(name)
  aliases = {alias or mod for mod, alias in _imports(name).items()}
  bad = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stiefax"):
      bad += [
        a.name
        for a in node.names
        if a.name.startswith("_")
        and a.name != "__version__"
        # The package's private modules (stiefax._routing) hold public helpers.
        and not (node.module == "stiefax" and (PACKAGE / f"{a.name}.py").exists())
      ]
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
    ):
      bad.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
  assert not bad, f"stiefax/{name}.py uses private names of other modules: {bad}"


def test_no_module_over_about_600_lines():
  lengths = {
    str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
    for p in PACKAGE.rglob("*.py")
  }
  too_long = {name: n for name, n in lengths.items() if n > 650}
  assert not too_long, too_long


def test_tests_do_not_import_test_modules():
  """Shared test helpers live in helper modules (cases, kernels, harness, reference)."""
  tests = pathlib.Path(__file__).resolve().parent
  offenders = []
  for path in tests.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ImportFrom) and node.module:
        mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if any(m.startswith("tests.test_") for m in mods):
          offenders.append(f"{path.name}: from {node.module} import ...")
  assert not offenders, offenders
