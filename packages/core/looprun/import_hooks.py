"""Import one module right after another one loads, without importing either now.

``loopvae`` registers ``LoopVAE`` with diffusers and ``srvit`` registers its classifiers with timm; both must
happen on ``import loopvae`` / ``import srvit`` for diffusers' and timm's generic loaders to find them, yet the
packages load their names lazily so that the command lines answer ``--help`` without torch. :func:`after_import`
keeps both: the registering module is imported at once when the library is already imported, otherwise right
after the library itself finishes loading.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any


class _ThenImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the first import of ``target`` so that ``then`` is imported once it has
    loaded. One shot: it leaves ``sys.meta_path`` on first use."""

    def __init__(self, target: str, then: str) -> None:
        self.target, self.then = target, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_import(module: Any) -> None:
            exec_module(module)
            if _initializing(self.then.split(".")[0]):
                # the package itself imported the target mid-way through its own import: importing ``then`` now
                # would meet half-initialised modules; the package calls after_import again once it is complete
                return
            importlib.import_module(self.then)

        spec.loader.exec_module = exec_then_import  # type: ignore[method-assign]
        return spec


def _initializing(package: str) -> bool:
    """Whether a module of ``package`` is being executed right now (importlib marks its spec)."""
    return any(name.split(".")[0] == package and getattr(getattr(m, "__spec__", None), "_initializing", False)
               for name, m in list(sys.modules.items()))


def after_import(target: str, then: str) -> None:
    """Import module ``then`` as soon as top-level module ``target`` is imported (now, if it already is). A package
    that may import ``target`` during its own import calls this again at the end of the module ``then`` needs."""
    if target in sys.modules:
        importlib.import_module(then)
    elif not any(isinstance(f, _ThenImport) and (f.target, f.then) == (target, then) for f in sys.meta_path):
        sys.meta_path.insert(0, _ThenImport(target, then))


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Any, Any]:
    """PEP 562 ``__getattr__`` / ``__dir__`` for a package whose public names live in submodules
    (``{name: submodule}``): each name is imported on first use and cached in the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            # a submodule, as an eagerly importing package would have bound it (``loopvae.loading``)
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
