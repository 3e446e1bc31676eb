"""A study's committed state: one result file per run, the pre-registration's hash and the pinned code version.

Layout under the study's ``docs`` folder::

    preregistration.md    written and committed before the registered runs
    plan.json             pinned at the first registered run: preregistration_sha256, main_commit, date
    runs/<run id>.json    one per finished (or failed) run, written atomically; commit each as it comes

A rerun on a fresh machine runs only the runs whose file is missing; a registered run refuses to start when the
pre-registration or the training code differs from what ``plan.json`` pinned.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class RegistrationError(RuntimeError):
    """A registered run would break the study's pre-registration or its pinned code version."""


class ResultStore:
    """The result files of one study under ``docs`` (a folder relative to the repository ``root``)."""

    def __init__(self, root: Path, docs: str | Path):
        self.root = Path(root)
        self.docs = self.root / docs
        self.runs = self.docs / "runs"

    def path(self, run_id: str) -> Path:
        return self.runs / f"{run_id}.json"

    def load(self, run_id: str) -> dict[str, Any] | None:
        path = self.path(run_id)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a JSON result file ({err}); restore it from git or delete it to rerun "
                             "that run") from err

    def all(self) -> dict[str, dict[str, Any]]:
        """Every result file, by run id (sorted)."""
        return {p.stem: self.load(p.stem) for p in sorted(self.runs.glob("*.json"))}  # type: ignore[misc]

    def write(self, run_id: str, record: dict[str, Any]) -> Path:
        """Write atomically (a kill leaves the old file or none, never half a file)."""
        self.runs.mkdir(parents=True, exist_ok=True)
        path = self.path(run_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)
        return path


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def source_dirs(root: Path) -> list[Path]:
    """The folders the code at ``root`` imports from (``pyproject.toml``'s
    ``[tool.setuptools.packages.find] where``); ``[]`` for a checkout without them."""
    import tomllib

    path = Path(root) / "pyproject.toml"
    if not path.is_file():
        return []
    where = tomllib.loads(path.read_text()).get("tool", {}).get("setuptools", {}).get("packages", {})
    return [(Path(root) / w).resolve() for w in where.get("find", {}).get("where", [])]


def source_env(root: Path) -> dict[str, str]:
    """This process's environment with ``root``'s source folders first on ``PYTHONPATH``: a run of a study whose
    code root is another checkout (a worktree of the pinned commit) imports that checkout's code, not the
    editable install's."""
    env = dict(os.environ)
    dirs = [str(d) for d in source_dirs(root)]
    if dirs:
        env["PYTHONPATH"] = os.pathsep.join([*dirs, *filter(None, [env.get("PYTHONPATH")])])
    return env


def foreign_imports(root: Path) -> list[str]:
    """Modules imported in this process from outside ``root`` whose package ``root``'s source folders also hold
    (e.g. ``loopvae`` from the main checkout while the study's code root is a worktree): ``"name: file"``."""
    out = []
    for folder in source_dirs(root):
        packages = [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()] if folder.is_dir() else []
        for package in sorted(packages):
            module = sys.modules.get(package)
            file = getattr(module, "__file__", None)
            if file and not Path(file).resolve().is_relative_to(folder):
                out.append(f"{package}: {file}")
    return out


def code_version(root: Path, paths: Sequence[str] = ("packages", "pipelines")) -> dict[str, Any]:
    """The commit the checkout at ``root`` is on, and whether its training code (``paths``) differs from it."""
    head = git(root, "rev-parse", "HEAD")
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    dirty = git(root, "status", "--porcelain", "--untracked-files=no", "--", *paths).stdout.strip()
    return {"commit": head.stdout.strip(), "dirty": bool(dirty)}


def registration(store: ResultStore, preregistration: str | None, code_paths: Sequence[str],
                 pin_code: bool = True, code_root: Path | None = None) -> dict[str, Any]:
    """Check (and at the first registered run, pin) the pre-registration and the training code.

    Raises :class:`RegistrationError` when the pre-registration is missing or differs from the pinned hash, or
    when the checkout's training code is uncommitted or differs from the pinned commit. ``code_root``: the checkout
    the runs train from (default: the store's root; a study may run from a worktree of its pinned commit while
    its result files go to the main checkout). Returns ``plan.json``."""
    code_root = code_root or store.root
    plan_file = store.docs / "plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {}
    changed = False
    if preregistration is not None:
        prereg = store.docs / preregistration
        if not prereg.is_file():
            raise RegistrationError(f"{prereg} does not exist: write the pre-registration (primaries, margins, seed "
                                    "count, rules) and commit it before the registered runs")
        digest = file_sha256(prereg)
        pinned = plan.get("preregistration_sha256")
        if pinned is None:
            plan["preregistration_sha256"], changed = digest, True
        elif pinned != digest:
            raise RegistrationError(
                f"{prereg} differs from the pre-registration the first registered run saw (sha256 {pinned[:12]}, "
                f"now {digest[:12]}); a pre-registration cannot change once its runs exist: restore it "
                f"(git log -- {prereg.name}) or register a new study")
    if pin_code:
        here = code_version(code_root, code_paths)
        if here["commit"] is None:
            raise RegistrationError(f"{code_root} is not a git checkout: registered runs pin a committed code version")
        if here["dirty"]:
            raise RegistrationError(f"the training code ({', '.join(code_paths)}) has uncommitted changes: every "
                                    "registered run trains on one committed version; commit, or run from a worktree "
                                    "of the study's commit")
        if "main_commit" not in plan:
            plan["main_commit"], changed = here["commit"], True
        elif plan["main_commit"] != here["commit"]:
            diff = git(code_root, "diff", "--quiet", plan["main_commit"], here["commit"], "--", *code_paths)
            if diff.returncode != 0:
                short = plan["main_commit"][:10]
                raise RegistrationError(
                    f"the training code differs from the study's pinned commit {short} (git diff {short} -- "
                    f"{' '.join(code_paths)}); run from a worktree of it: git worktree add ../study-{short} {short}")
    if changed:
        plan.setdefault("date", time.strftime("%Y-%m-%d %H:%M"))
        store.docs.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps(plan, indent=1) + "\n")
    return plan
