"""The ``distai`` command's entry point: the CLI, and a Ctrl-C that comes while it is still being imported
(the first fraction of a second) ends it quietly with the shell's 130, not a traceback."""
from __future__ import annotations

import sys


def interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a Ctrl-C, or an error raised from one: Python 3.11 turns a KeyboardInterrupt that lands
    in a class's ``__set_name__`` into a RuntimeError (as one did in pydantic's import, which Typer makes). Here,
    where nothing is imported, so that a failed import of the CLI can still ask."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def main() -> int:
    try:
        from .cli import main as cli_main
    except BaseException as exc:  # a Ctrl-C while importing, plain or wrapped: the shell's 130, no traceback
        if interrupted(exc):
            return 130
        raise
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
