"""The ``distai`` command's entry point: the CLI, and a Ctrl-C that comes while it is still being imported
(the first fraction of a second) ends it quietly with the shell's 130, not a traceback."""
from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a Ctrl-C Python wrapped (see cli.interrupted, not importable if this failed)
        chain: BaseException | None = exc
        for _ in range(8):  # a chain's few links (a cycle ends the search)
            chain = chain.__cause__ or chain.__context__ if chain is not None else None
            if isinstance(chain, KeyboardInterrupt):
                return 130
        raise
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
