"""Packaging metadata: compatible ranges in pyproject.toml, the exact tested set in constraints.txt, the licence.

pyproject.toml states what loopvision works with (``>=tested,<next major``, next minor for 0.x and for
torch/torchvision); constraints.txt pins what it was tested with, and ``make setup`` installs with it.
"""

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
DEV = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]]
PLOTS = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["plots"]]

# distribution -> top-level module, where they differ
MODULE_OF = {"pillow": "PIL", "pyyaml": "yaml"}
# runtime dependencies that no loopvision module imports by name, and the import that needs them
INDIRECT = {
    "torch-fidelity": ("packages/vae/loopvae/metrics.py", "torchmetrics.image.fid"),  # FID's InceptionV3
    "tensorboard": ("packages/core/looprun/trackers.py", "torch.utils.tensorboard"),  # SummaryWriter
}


def constraints() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for number, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt:{number}: not an exact `name==version` pin: {raw!r}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"constraints.txt:{number}: {name} pinned twice"
        pins[name] = Version(match[2])
    return pins


def imported_modules(*folders: str) -> set[str]:
    """Top-level names of every ``import X`` / ``from X import`` (absolute) under ``folders``."""
    names: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def bounds(req: Requirement) -> tuple[Version, Version]:
    ops = {spec.operator: Version(spec.version) for spec in req.specifier}
    return ops[">="], ops["<"]


@pytest.mark.parametrize("req", RUNTIME + DEV + PLOTS, ids=str)
def test_every_dependency_is_a_compatible_range_not_a_pin(req: Requirement) -> None:
    operators = sorted(spec.operator for spec in req.specifier)
    assert operators == ["<", ">="], f"{req}: want `>=oldest,<next`, got operators {operators}"
    low, high = bounds(req)
    tested = constraints()[canonicalize_name(req.name)]
    # the lower bound admits the tested version (it may be older: the oldest API we need, stated in pyproject);
    # the upper bound is no wider than the tested version's next major (next minor for 0.x): a breaking release
    # is never admitted untested
    limit = Version(f"0.{tested.minor + 1}") if tested.major == 0 else Version(f"{tested.major + 1}")
    assert low <= tested < high <= limit, f"{req}: want {low} <= tested {tested} < {high} <= {limit}"


def test_plots_are_an_extra_and_the_tests_tools_are_declared() -> None:
    names = lambda reqs: {canonicalize_name(r.name) for r in reqs}
    assert "matplotlib" not in names(RUNTIME) and "matplotlib" in names(PLOTS) and "matplotlib" in names(DEV)
    assert "packaging" in names(DEV)  # this file imports it
    # the library installs without the numpy / pillow / pyyaml / tqdm of the day
    for name, oldest in (("numpy", "1.26"), ("pillow", "10.0"), ("pyyaml", "6.0"), ("tqdm", "4.66")):
        (req,) = [r for r in RUNTIME if canonicalize_name(r.name) == name]
        assert bounds(req)[0] == Version(oldest)
    assert re.search(r"pip install -q pip==[0-9.]+", (ROOT / "Makefile").read_text())  # make setup pins pip


def test_every_dependency_has_an_exact_pin_in_constraints_that_satisfies_its_range() -> None:
    pins = constraints()
    for req in RUNTIME + DEV + PLOTS:
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is a dependency but constraints.txt does not pin it"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints pin {name}=={pins[name]} " \
                                                                     f"is outside {req.specifier}"
    assert "loopvision" not in pins  # the project itself is not a constraint
    assert pins[canonicalize_name("torch")] == Version("2.14.1")  # the tested torch


def test_make_setup_installs_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    stamp_rule = re.search(r"^\$\(STAMP\):(.*)$", makefile, flags=re.M)
    assert stamp_rule and "constraints.txt" in stamp_rule[1].split() and "pyproject.toml" in stamp_rule[1].split()
    assert re.search(r"pip install -e '\.\[dev\]' -c constraints\.txt", makefile)


def test_license_file_matches_the_metadata() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    for needle in ("Apache License", "Version 2.0, January 2004", "http://www.apache.org/licenses/",
                   "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS",
                   "9. Accepting Warranty or Additional Liability."):
        assert needle in text, needle


def test_scipy_is_a_runtime_dependency_because_the_statistics_use_it() -> None:
    # loopvae compare's seed-level verdicts need t quantiles and p-values (looprun.statistics)
    assert "scipy" in {canonicalize_name(r.name) for r in RUNTIME}
    assert "scipy" in imported_modules("packages", "pipelines")


def test_every_runtime_dependency_is_used() -> None:
    """Each runtime dependency is imported by loopvision's own modules, or needed by a named import of theirs."""
    imported = imported_modules("packages", "pipelines")
    for req in RUNTIME:
        name = canonicalize_name(req.name)
        if name in INDIRECT:
            path, module = INDIRECT[name]
            assert module in (ROOT / path).read_text(), f"{name} is kept for {module} in {path}, which is gone"
            continue
        module = MODULE_OF.get(name, name.replace("-", "_"))
        assert module in imported, f"runtime dependency {name} ({module}) is imported nowhere in packages/ pipelines/"
