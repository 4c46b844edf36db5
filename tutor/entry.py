"""The ``distai`` command's entry point: the CLI, and a Ctrl-C that comes while it is still being imported
(the first fraction of a second) ends it quietly with the shell's 130, not a traceback."""
from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
