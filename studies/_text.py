"""Static prose of a study page, kept in a committed markdown file next to its results: ``section(path, name)``
gives the lines between ``<!-- section: NAME -->`` and the next such marker (or the end of the file);
``paragraph(path, name, **values)`` gives them as one string with their ``{fields}`` filled in (``str.format``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = re.compile(r"<!-- section: (\S+) -->")


def section(path: Path, name: str) -> list[str]:
    """The lines of section ``name`` of ``path``, without leading / trailing blank lines."""
    lines, current, out, found = Path(path).read_text().splitlines(), None, [], False
    for line in lines:
        if (match := MARKER.fullmatch(line.strip())) is not None:
            current = match.group(1)
            found = found or current == name
        elif current == name:
            out.append(line)
    if not found:
        raise LookupError(f"no section {name!r} in {path} (a line '<!-- section: {name} -->')")
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def paragraph(path: Path, name: str, *args: Any, **values: Any) -> str:
    """Section ``name`` of ``path`` as one string (its lines joined by newlines), ``str.format``-ed with the
    arguments (a section read this way writes a literal brace as ``{{`` / ``}}``)."""
    return "\n".join(section(path, name)).format(*args, **values)
