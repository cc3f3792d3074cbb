"""The package's layers, read from the source with `ast`: no import cycle, settings on the ground floor, a planner
that imports only the standard library and does no I/O, and a CLI module that nothing imports."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

import imagenet_train

pytestmark = pytest.mark.unit

# The package as imported, so that PYTHONPATH picks the checkout these checks read (REPO's app/ in the suite).
PACKAGE = Path(imagenet_train.__file__).resolve().parent
ROOT = "imagenet_train"
# Leaves checked below to import only the standard library: plain exceptions (the planner's verdicts and refusals
# are one-line user errors like everywhere else) and the settings' closed sets and shared defaults.
PLANNING_MAY_IMPORT = {f"{ROOT}.errors", f"{ROOT}.choices"}
# Modules that reach files, sockets or processes; planning/ takes numbers and returns numbers.
IO_MODULES = {"os", "io", "pathlib", "shutil", "tempfile", "glob", "socket", "subprocess", "urllib", "http", "fcntl"}
IO_CALLS = {"open", "input", "print"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir", "touch", "unlink", "glob"}


def module_name(path: Path) -> str:
    """The dotted name of a source file under the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def imported(name: str) -> list[tuple[str, int]]:
    """Every module `name` imports anywhere in its source (function-level imports too), with the line."""
    found = []
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            found += [
                (f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base, node.lineno)
                for alias in node.names
            ]
    return found


def internal_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    return {name: {target for target, _ in imported(name) if target in MODULES} - {name} for name in MODULES}


def layer(module: str) -> str:
    """The package or top-level module a module belongs to: imagenet_train.planning, imagenet_train.config, ..."""
    return ".".join(module.split(".")[:2])


def shortest_cycle(graph: dict[str, set[str]], start: str) -> list[str]:
    """The shortest path from `start` back to itself, as a list that ends where it starts ([] if none)."""
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for target in sorted(graph.get(node, ())):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                todo.append(target)
    return []


def all_cycles(graph: dict[str, set[str]]) -> list[str]:
    """The shortest cycle in each group of nodes that reach each other, each as "a -> b -> a"."""
    reach = {node: reachable(graph, node) for node in graph}
    groups = {frozenset(n for n in reach[node] if node in reach[n]) | {node} for node in graph}
    found = []
    for group in sorted(groups, key=sorted):
        if len(group) > 1:
            cycles = [shortest_cycle(graph, node) for node in sorted(group)]
            found.append(" -> ".join(min(cycles, key=len)))
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The nodes `start` reaches through one edge or more."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return seen


def test_no_module_imports_a_module_that_imports_it_back():
    cycles = all_cycles(internal_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_package_imports_a_package_that_imports_it_back():
    layers: dict[str, set[str]] = {}
    for module, targets in internal_graph().items():
        layers.setdefault(layer(module), set()).update(layer(t) for t in targets if layer(t) != layer(module))
    cycles = all_cycles({name: layers.get(name, set()) for name in {*layers, *set().union(*layers.values())}})
    assert not cycles, "import loops between packages:\n" + "\n".join(cycles)


def test_the_planner_imports_only_the_standard_library_and_itself():
    wrong = []
    for name in MODULES:
        if layer(name) != f"{ROOT}.planning":
            continue
        for target, line in imported(name):
            top = target.split(".")[0]
            own = target == f"{ROOT}.planning" or target.startswith(f"{ROOT}.planning.")
            if own or target in PLANNING_MAY_IMPORT:
                continue
            if top not in sys.stdlib_module_names or top in IO_MODULES:
                wrong.append(f"{MODULES[name].relative_to(PACKAGE)}:{line} imports {target}")
    assert not wrong, "planning/ must be pure arithmetic:\n" + "\n".join(wrong)


def test_what_the_planner_may_import_imports_only_the_standard_library():
    for name in PLANNING_MAY_IMPORT:
        outside = [t for t, _ in imported(name) if t.split(".")[0] not in sys.stdlib_module_names]
        assert not outside, f"{name} imports {outside}, which planning/ would then import"


# The ground floor, and what each of its modules may import of the project besides the standard library: the
# settings (config.py), their closed sets and shared defaults (choices.py), the declaration machinery, plain
# exceptions, the redaction of secrets that config.json's values pass through, and the checks across settings
# (config_checks.py; what an installation must have for them is main/entry_checks.py's). Every package types
# against it, so it imports none of them.
GROUND_FLOOR = {
    f"{ROOT}.config": {
        f"{ROOT}.errors",
        f"{ROOT}.choices",
        f"{ROOT}.declarations",
        f"{ROOT}.limits",
        f"{ROOT}.redact",
    },
    f"{ROOT}.limits": set(),
    f"{ROOT}.config_checks": {f"{ROOT}.config", f"{ROOT}.errors", f"{ROOT}.choices"},
    f"{ROOT}.choices": {f"{ROOT}.errors"},
    f"{ROOT}.declarations": {f"{ROOT}.errors"},
    f"{ROOT}.errors": set(),
    f"{ROOT}.redact": set(),
}


@pytest.mark.parametrize("name", sorted(GROUND_FLOOR))
def test_the_settings_import_nothing_above_the_ground_floor(name):
    wrong = sorted(
        {
            f"{MODULES[name].relative_to(PACKAGE)}:{line} imports {target}"
            for target, line in imported(name)
            if target not in GROUND_FLOOR[name] and target.split(".")[0] not in sys.stdlib_module_names
        }
    )
    assert not wrong, "the settings must sit on the ground floor:\n" + "\n".join(wrong)


# Private helpers of io/gcs.py and io/s3.py, which share the name until io/'s storage-scheme table renames them.
SHARED_CLASS_NAMES = {"_Body"}


def test_no_two_modules_define_a_class_of_the_same_name():
    where: dict[str, list[str]] = {}
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{MODULES[name].relative_to(PACKAGE)}:{node.lineno}")
    twice = [f"{cls}: {', '.join(places)}" for cls, places in sorted(where.items()) if len(places) > 1]
    assert [line for line in twice if line.split(":")[0] not in SHARED_CLASS_NAMES] == [], "\n".join(twice)


# Parameter names that hold a run's settings or a section of them; typed `Any`, a reader cannot follow them to
# config.py.
CONFIG_PARAMETERS = {"cfg", "config", "data", "optim", "run", "optim_cfg", "setup", "section"}


def _is_any(annotation: ast.expr | None) -> bool:
    """Whether an annotation is `Any`, `typing.Any` or a union with it (`Any | None`)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.BinOp):
        return _is_any(annotation.left) or _is_any(annotation.right)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "Any" in annotation.value.replace(" ", "").split("|")
    return (isinstance(annotation, ast.Name) and annotation.id == "Any") or (
        isinstance(annotation, ast.Attribute) and annotation.attr == "Any"
    )


def test_no_parameter_holding_settings_is_typed_any():
    found = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if argument.arg in CONFIG_PARAMETERS and _is_any(argument.annotation):
                    where = f"{MODULES[name].relative_to(PACKAGE)}:{node.lineno}"
                    found.append(f"{where}: {node.name}({argument.arg}: {ast.unparse(argument.annotation)})")
    assert not found, "type these against config.py (planning/: a Protocol of its own):\n" + "\n".join(found)


def test_the_planner_does_no_file_io():
    calls = []
    for name in MODULES:
        if layer(name) != f"{ROOT}.planning":
            continue
        for node in ast.walk(TREES[name]):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (isinstance(func, ast.Name) and func.id in IO_CALLS) or (
                isinstance(func, ast.Attribute) and func.attr in IO_METHODS
            ):
                calls.append(f"{MODULES[name].relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(func)}(...)")
    assert not calls, "planning/ must do no I/O:\n" + "\n".join(calls)


def test_nothing_in_the_package_imports_the_cli_module():
    # cli.py is the console script's entry: parse and dispatch. Commands live in commands/.
    importers = [
        f"{MODULES[name].relative_to(PACKAGE)}:{line}"
        for name in MODULES
        for target, line in imported(name)
        if target == f"{ROOT}.cli"
    ]
    assert not importers, f"{ROOT}.cli imported by: {', '.join(importers)}"


# The decoders and per-sample augmentation live in loading/; training asks loading.batches for device batches.
DECODERS = {
    f"{ROOT}.loading.dali",
    f"{ROOT}.loading.fused_decoder",
    f"{ROOT}.loading.presets",
    f"{ROOT}.datasets.pixels",
    "simplejpeg",
    "turbojpeg",
    "PIL",
    "nvidia",
}


def test_the_training_package_imports_no_decoder():
    found = [
        f"{MODULES[name].relative_to(PACKAGE)}:{line} imports {target}"
        for name in MODULES
        if layer(name) == f"{ROOT}.training"
        for target, line in imported(name)
        if target in DECODERS or target.split(".")[0] in DECODERS
    ]
    assert not found, "training/ must not decode images:\n" + "\n".join(found)


# The loop, the input pipeline and the run directory stand side by side: main/ builds the batches and the run
# directory and hands them to the trainer (training/parts.py types them), as torchvision's main() builds the loaders.
SIDE_BY_SIDE = (f"{ROOT}.training", f"{ROOT}.loading", f"{ROOT}.rundir")


def test_training_loading_and_the_run_directory_import_none_of_each_other():
    found = [
        f"{MODULES[name].relative_to(PACKAGE)}:{line} imports {target}"
        for name in MODULES
        if layer(name) in SIDE_BY_SIDE
        for target, line in imported(name)
        if layer(target) in SIDE_BY_SIDE and layer(target) != layer(name)
    ]
    assert not found, "training/, loading/ and rundir/ are handed each other's objects by main/:\n" + "\n".join(found)


# A module past ~400 lines has stopped doing one job; the loop and the epoch stream read top to bottom.
MAX_LINES = 400
# The loop and the epoch stream read top to bottom: the loop's extras are hooks, the stream's stages are stages.
SHORTER = {"training/loop.py": 280, "loading/stream.py": 300}
# config.py is one declaration per setting (the house rule: every setting is declared there once), so it grows
# with the settings, not with what it does (issue 49 splits its data section by concern).
LONGER = {"config.py": 600}


def test_no_module_is_longer_than_it_should_be():
    long = []
    for path in MODULES.values():
        relative = str(path.relative_to(PACKAGE))
        lines = len(path.read_text().splitlines())
        limit = SHORTER.get(relative) or LONGER.get(relative, MAX_LINES)
        if lines > limit:
            long.append(f"{relative}: {lines} lines (at most {limit})")
    assert not long, "split these by job:\n" + "\n".join(long)


# torchvision's train.py imports 3 of its reference's modules; the loop orchestrates parts that others build
# (step.build, the batches and run directory main/ hands it, the hooks), so it names a handful, not every module
# on the way.
LOOP_MAY_IMPORT = 12


def test_the_loop_imports_a_dozen_of_the_package_modules_at_most():
    modules = sorted({target for target, _ in imported(f"{ROOT}.training.loop") if target in MODULES})
    assert len(modules) <= LOOP_MAY_IMPORT, f"training/loop.py imports {len(modules)}: {', '.join(modules)}"


def test_every_import_of_the_package_names_something_that_exists():
    # Function-level imports run only on their path (evaluate, DALI, a launcher): a module renamed in a
    # redesign leaves them pointing at nothing until a user takes that path.
    missing = []
    for name in MODULES:
        package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets = [(base, alias.name) for alias in node.names]
            else:
                continue
            for module, attribute in targets:
                if not (module == ROOT or module.startswith(f"{ROOT}.")):
                    continue
                where = f"{MODULES[name].relative_to(PACKAGE)}:{node.lineno}"
                if module not in MODULES:
                    missing.append(f"{where}: no module {module}")
                elif attribute and f"{module}.{attribute}" not in MODULES and not _defines(module, attribute):
                    missing.append(f"{where}: {module} has no {attribute}")
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)


def _defines(module: str, attribute: str) -> bool:
    """Whether `module`'s top level defines, assigns or imports `attribute`."""
    for node in TREES[module].body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attribute:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
                return True
        imports = node.names if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        if any((alias.asname or alias.name.split(".")[0]) == attribute for alias in imports):
            return True
        if isinstance(node, (ast.If, ast.Try)) and attribute in ast.unparse(node):  # guarded definitions
            return True
    return False


# What a comment or docstring may name: a module as imagenet_train.x.y or x.y (and an attribute of it), a file of the
# package as x/y.py, a file of the repository as tools/x.py, tests/..., docs/..., ...
TOP_NAMES = sorted({name.split(".")[1] for name in MODULES if name.count(".") >= 1})
DOTTED = re.compile(rf"(?<![\w.])(?:imagenet_train\.)?((?:{'|'.join(TOP_NAMES)})(?:\.\w+)+)")
SUFFIXES = {"py", "md", "yaml", "json", "jsonl", "txt", "conf", "sh", "pt"}
PATHS = re.compile(r"(?<![\w./-])((?:[a-z_]+/)+[\w.-]+\.(?:py|md|yaml|json|conf|sh))\b")
REPO_FOLDERS = ("tools", "tests", "docs", "images", "helm", "bench", "examples", "recipes", "manifests")


def stale_mentions(name: str, source: str) -> list[str]:
    """The modules and files a module's comments and docstrings name that do not exist (moved or gone)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        for mention in DOTTED.findall(token.string):
            parts = [ROOT, *mention.split(".")]
            if parts[-1] in SUFFIXES:
                continue  # a file's name (config.py, deployment.yaml): PATHS checks those with a folder
            known = next((i for i in range(len(parts), 1, -1) if ".".join(parts[:i]) in MODULES), 0)
            if not known or (known < len(parts) and not _defines(".".join(parts[:known]), parts[known])):
                found.append(f"{name}:{token.start[0]}: {mention}")
        for path in PATHS.findall(token.string):
            top = path.split("/")[0]
            if top in REPO_FOLDERS:
                exists = (PACKAGE.parents[1] / path).exists()
            elif (PACKAGE / top).is_dir():
                exists = (PACKAGE / path).exists()
            else:
                continue  # another project's file (ray/_common/usage/usage_lib.py)
            if not exists:
                found.append(f"{name}:{token.start[0]}: {path}")
    return found


def test_comments_and_docstrings_name_only_modules_and_files_that_exist():
    stale = [line for name, path in MODULES.items() for line in stale_mentions(name, path.read_text())]
    assert not stale, "comments naming a module or file that moved:\n" + "\n".join(stale)


def test_the_check_finds_a_mention_of_a_module_that_moved():
    source = '"""Read by imagenet_train.loading.pipeline, training.progress.StatusClient and loading/pipeline.py;\n'
    source += 'see loading.stream.EpochLoader, imagenet_train.planning.plan and loading/stream.py."""\n'
    assert stale_mentions("m", source) == [
        "m:1: loading.pipeline",
        "m:1: training.progress.StatusClient",
        "m:1: loading/pipeline.py",
    ]
