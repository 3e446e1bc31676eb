"""Keep ``docs/benchmarks.md`` as named sections, each rewritten by the benchmark that owns it."""

from __future__ import annotations

from pathlib import Path

HEADER = """# Benchmarks

Produced by `make bench` on the machine named in each section; every section states the command that
produced it. Ratios are measured side by side in one run; absolute times on a shared 2-core machine
are noise.
"""


def update_section(path: Path, name: str, text: str) -> None:
    """Replace (or append) the section ``name`` of the markdown file ``path`` with ``text``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    body = path.read_text() if path.is_file() else HEADER
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in body and end in body:
        before, rest = body.split(begin, 1)
        _, after = rest.split(end, 1)
        body = before + block + after
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)


def publish(text: str, out: Path | None, name: str) -> None:
    """Print a benchmark's markdown ``text`` and, with ``out``, make it the section ``name`` of that file."""
    print(text)
    if out is not None:
        update_section(Path(out), name, text)
