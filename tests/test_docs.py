"""Every user-facing text stands on its own: no pointers to files a user of this repository does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loopdata.cli import build_parser as loopdata_parser
from loopvae.cli import build_parser as loopvae_parser
from srvit.cli import build_parser as srvit_parser

ROOT = Path(__file__).resolve().parents[1]
# Internal planning documents of the team (not shipped) and the tracker's wording.
FORBIDDEN = re.compile(r"\bSPEC(?:\.md)?\b|\bPRACTICES(?:\.md)?\b|(?i:\bthe issue\b|\bissue #?\d+\b)")


def _documents() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "assets").rglob("*.md"))]
    return [p for p in docs if p.is_file()]


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_do_not_point_at_files_users_do_not_have(path: Path) -> None:
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)


def _help_texts(parser) -> list[str]:
    texts = [parser.format_help()]
    for action in parser._actions:
        for sub in getattr(action, "choices", None).values() if hasattr(action, "_name_parser_map") else []:
            texts += _help_texts(sub)
    return texts


@pytest.mark.parametrize("build", [loopvae_parser, srvit_parser, loopdata_parser])
def test_command_line_help_is_self_contained(build) -> None:
    for text in _help_texts(build()):
        assert not FORBIDDEN.search(text), text


def test_the_checker_catches_what_it_should() -> None:
    assert FORBIDDEN.search("see SPEC section 4") and FORBIDDEN.search("as PRACTICES.md says")
    assert FORBIDDEN.search("as the issue asks") and not FORBIDDEN.search("a known issue with DDP")
    assert not FORBIDDEN.search("def load(spec: str)")  # the word, not the document


def test_module_docstrings_and_comments_are_self_contained() -> None:
    sources = sorted((ROOT / "packages").rglob("*.py")) + sorted((ROOT / "pipelines").rglob("*.py"))
    assert len(sources) > 50
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
            for n, line in enumerate(p.read_text().splitlines(), 1) if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)
