"""Every study page re-renders through the engine from its committed result files alone, byte for byte, with the
same results.json; and the study code has no import circles."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from looprun.study import available_studies, load_study
from looprun.study.page import render

ROOT = Path(__file__).resolve().parents[1]
STUDIES = available_studies(ROOT)


def test_there_are_studies() -> None:
    assert "sharing" in STUDIES, STUDIES


@pytest.mark.parametrize("name", STUDIES)
def test_page_re_renders_unchanged_from_the_committed_results(name: str) -> None:
    study = load_study(name, ROOT)
    text, results = render(study, ROOT, write=False)
    committed = (ROOT / study.page).read_text()
    assert text == committed, f"{study.page} differs from its re-render: run `loopvae study {name} --render-only`"
    committed_results = json.loads((ROOT / study.docs / "results.json").read_text())
    assert json.loads(json.dumps(results)) == committed_results


def _local_imports(path: Path, names: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0] if not node.module.startswith("looprun.study") else node.module)
    return found & names


def test_no_two_study_files_import_each_other() -> None:
    files = {p.stem: p for folder in ("studies", "benchmarks") for p in (ROOT / folder).glob("*.py")}
    files |= {f"looprun.study.{p.stem}": p for p in (ROOT / "packages/core/looprun/study").glob("*.py")}
    graph = {name: _local_imports(path, set(files)) - {name} for name, path in files.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a, {b})})
    assert not circles, f"import circles: {circles}"
