"""One run of a study in its own interpreter: ``python -m looprun.study.worker <task.json>`` (the local pool's
subprocess; see :func:`looprun.study.engine.execute_run`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from looprun.study.engine import execute_run


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m looprun.study.worker <task.json>", file=sys.stderr)
        return 2
    outcome = execute_run(json.loads(Path(args[0]).read_text()))
    return 0 if outcome["status"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
