"""The package's import graph keeps its layers: from balance (pure) and utils up to workers, no module imports one
of a higher layer, no modules import each other in a circle, and the core never imports compat/; upstream's
module paths that only hand names on (faces) may."""
import ast
import os
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = "mindspeed_rl"
# low to high; a module may import its own layer and those below
LAYERS = ("_lazy", "balance", "utils", "families", "config_cls", "data", "algorithms", "tools", "agent", "models",
          "rewards", "datasets", "plan", "trainer", "workers", "compat", "reports")
# upstream's module paths kept as faces (names handed on from the core and compat/, nothing defined)
FACES = {"mindspeed_rl.trainer.utils.transfer_dock", "mindspeed_rl.trainer.utils.compute_utils",
         "mindspeed_rl.workers.rule_reward", "mindspeed_rl.utils.seqlen_balancing", "mindspeed_rl.utils.pad_process",
         "mindspeed_rl.config_cls.validate_config",
         # the reports' old paths: ``python -m mindspeed_rl.tools.balance_report`` / ``memory_plan`` still run
         "mindspeed_rl.tools.balance_report", "mindspeed_rl.tools.memory_plan"}
def _modules():
    mods = {}
    for folder, _, files in os.walk(os.path.join(ROOT, PKG)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[mod[:-len(".__init__")] if mod.endswith(".__init__") else mod] = path
    return mods


def _graph():
    mods, edges, defines = _modules(), defaultdict(set), {}
    for mod, path in mods.items():
        tree = ast.parse(open(path).read())
        defines[mod] = any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) for n in tree.body)
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        for node in ast.walk(tree):  # imports inside functions count too
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges[mod] |= {n for n in names if n in mods and n != mod and n != PKG}
    return mods, edges, defines


def _layer(mod):
    parts = mod.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def test_no_import_runs_up_a_layer():
    _, edges, _ = _graph()
    up = sorted((a, b) for a, targets in edges.items() for b in targets
                if a not in FACES and _layer(b) > _layer(a) and not b.endswith(("__init__",)))
    assert up == []


def test_the_core_never_imports_compat():
    _, edges, _ = _graph()
    core = [(a, b) for a, targets in edges.items() for b in targets
            if b.startswith(f"{PKG}.compat") and not a.startswith(f"{PKG}.compat") and a not in FACES]
    assert core == []


def test_faces_define_nothing():
    _, _, defines = _graph()
    assert [f for f in FACES if defines[f]] == []


def _circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_circle():
    _, edges, _ = _graph()
    assert _circles(edges) == []


@pytest.mark.parametrize("edge", [("mindspeed_rl.balance.seqlen_balancing", "mindspeed_rl.models.packing"),
                                  ("mindspeed_rl.trainer.stage_runner", "mindspeed_rl.compat.transfer_dock")])
def test_the_checks_see_a_bad_import(edge):
    a, b = edge
    _, edges, _ = _graph()
    edges[a].add(b)
    assert _layer(b) > _layer(a) or b.startswith(f"{PKG}.compat")
    edges[b].add(a)
    assert any({a, b} <= c for c in _circles(edges))
