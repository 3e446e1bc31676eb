"""Scanning image folders into an ordered list of samples to write (keys, labels, files).

Three layouts:

* ``classes``: ImageNet-style ``<root>/<class>/**/<file>``; label = index of the class folder name in the
  sorted list of class folders (for ImageNet wnids this is the standard ImageNet-1K index).
* ``flat``: unlabelled images directly in ``<root>``.
* labels file: images under ``<root>`` plus a text file of ``<relative filename> <label>`` lines (as for
  the ImageNet validation set); a label is an integer, or a class name mapped through ``class_names``.

Order is deterministic: sorted by class index then relative path, or by relative path. Keys are the file
stems with dots replaced by underscores (webdataset cuts keys at the first dot). If two files of a class
tree share a stem, every key becomes ``<class>_<stem>``. Files that cannot be used are returned as
:class:`Skipped` with a reason, never dropped silently.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .folders import walk_files

LAYOUTS = ("auto", "classes", "flat")


@dataclass(frozen=True)
class SourceItem:
    """One image file to write.

    Attributes:
        path: the file.
        relpath: path relative to the source root (POSIX separators), stored in the sample's ``.json``.
        key: the sample key.
        label: class index, or ``None`` for unlabelled data.
        class_name: class folder name / label name, when known.
    """

    path: Path
    relpath: str
    key: str
    label: int | None = None
    class_name: str | None = None


@dataclass(frozen=True)
class Skipped:
    """A file left out, with the reason (written to ``<prefix>_skipped.txt``)."""

    path: str
    reason: str


def sanitize_key(stem: str) -> str:
    """A webdataset-safe key from a file stem: no dots (they start the extension), no path separators."""
    return stem.replace(".", "_").replace("/", "_").replace("\\", "_")


def _files(directory: Path, recursive: bool) -> list[Path]:
    return walk_files(directory, recursive=recursive)  # directory links followed, broken links named


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _check_unique(items: list[SourceItem]) -> None:
    counts = Counter(item.key for item in items)
    duplicates = [key for key, n in counts.items() if n > 1]
    if duplicates:
        clash = [item.relpath for item in items if item.key == duplicates[0]]
        raise ValueError(
            f"{len(duplicates)} sample key(s) are not unique, e.g. {duplicates[0]!r} from {clash}; "
            "keys are file stems with dots replaced by '_': rename the files so that stems differ"
        )


def detect_layout(root: Path) -> str:
    """``classes`` if ``root`` holds only sub-folders, ``flat`` if only files; mixed trees are an error."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    dirs = [p for p in entries if p.is_dir()]
    files = [p for p in entries if p.is_file()]
    if dirs and not files:
        return "classes"
    if files and not dirs:
        return "flat"
    if not entries:
        raise ValueError(f"{root} is empty")
    raise ValueError(
        f"{root} holds both {len(dirs)} folder(s) and {len(files)} file(s); pass --layout classes (loose "
        "files are reported and left out) or --layout flat (sub-folders are reported and left out)"
    )


def scan_classes(root: Path) -> tuple[list[SourceItem], list[Skipped], list[str]]:
    """Scan a class-folder tree. Returns ``(items, skipped, class_names)``; label = sorted folder index."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"{root} has no class folders (expected <root>/<class>/<image files>)")
    index = {name: label for label, name in enumerate(classes)}
    skipped, items = [], []
    # one walk from the root (as folders-as-data reads it): a linked folder reached twice is read once
    for path in _files(root, recursive=True):
        parts = Path(_rel(path, root)).parts
        if len(parts) == 1:
            skipped.append(Skipped(_rel(path, root), "not inside a class folder"))
        elif parts[0] in index:
            items.append(SourceItem(path, _rel(path, root), sanitize_key(path.stem), index[parts[0]], parts[0]))
    if len({item.key for item in items}) < len(items):
        # Generic trees (cat/001.jpg, dog/001.jpg) reuse stems; ImageNet's never do.
        items = [
            SourceItem(
                i.path, i.relpath, sanitize_key(f"{i.class_name}_{i.path.stem}"), i.label, i.class_name
            )
            for i in items
        ]
    _check_unique(items)
    return items, skipped, classes


def scan_flat(root: Path) -> tuple[list[SourceItem], list[Skipped]]:
    """Scan a flat folder of unlabelled images; sub-folders are reported as skipped."""
    skipped = [
        Skipped(_rel(p, root) + "/", "sub-folder (flat layout reads top-level files only)")
        for p in sorted(root.iterdir())
        if p.is_dir()
    ]
    items = [SourceItem(p, _rel(p, root), sanitize_key(p.stem)) for p in _files(root, recursive=False)]
    _check_unique(items)
    return items, skipped


def load_class_names(spec: str | os.PathLike) -> list[str]:
    """Class names in index order from a file (one per line) or a class-folder tree (sorted folder names)."""
    path = Path(spec)
    if path.is_dir():
        return sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if path.is_file():
        return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    raise ValueError(f"class names source {path} is neither a file nor a directory")


def scan_labels_file(
    root: Path, labels_file: Path, class_names: list[str] | None = None
) -> tuple[list[SourceItem], list[Skipped]]:
    """Scan ``root`` with a ``<relative filename> <label>`` labels file (``#`` comments, blank lines ok).

    Files listed but missing and files present but unlisted are reported as skipped.
    """
    index = {name: i for i, name in enumerate(class_names or [])}
    labels: dict[str, tuple[int, str | None]] = {}
    for lineno, line in enumerate(Path(labels_file).read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) != 2:
            raise ValueError(f"{labels_file}:{lineno}: expected '<filename> <label>', got {line!r}")
        name, token = parts
        try:
            label, class_name = int(token), None
        except ValueError:
            if token not in index:
                hint = (
                    "it is not among the given class names"
                    if class_names
                    else "pass --class-names FILE_OR_DIR to map names to indices"
                )
                raise ValueError(
                    f"{labels_file}:{lineno}: label {token!r} is not an integer; {hint}"
                ) from None
            label, class_name = index[token], token
        if label < 0:
            raise ValueError(f"{labels_file}:{lineno}: negative label {label}")
        if name in labels:
            raise ValueError(f"{labels_file}:{lineno}: {name!r} is listed twice")
        labels[name] = (label, class_name)
    present = {_rel(p, root): p for p in _files(root, recursive=True)}
    labels_path = Path(labels_file).resolve()
    skipped = [
        Skipped(rel, "not in the labels file")
        for rel, p in present.items()
        if rel not in labels and p.resolve() != labels_path
    ]
    items = []
    for name in sorted(labels):
        label, class_name = labels[name]
        if name not in present:
            skipped.append(Skipped(name, "listed in the labels file but missing"))
            continue
        items.append(SourceItem(present[name], name, sanitize_key(Path(name).stem), label, class_name))
    _check_unique(items)
    return items, skipped
