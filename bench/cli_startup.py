"""How long `distai --help` takes next to a bare `python -c "import typer"`.

Goal (issue 2): `distai --help` within about 4x the bare Typer import. Both are run as fresh
processes, interleaved, and the medians compared. Usage: python bench/cli_startup.py [--runs N]
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from _bench import options, ratio, timed_rounds


def distai_command() -> list[str]:
    script = Path(sys.executable).with_name("distai")
    if script.exists():
        return [str(script), "--help"]
    found = shutil.which("distai")
    return [found, "--help"] if found else [sys.executable, "-m", "distai.tutor.cli", "--help"]


def run_quietly(cmd: list[str]) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="0")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def main() -> int:
    args = options(__doc__, runs=9).parse_args()
    help_cmd = distai_command()
    typer_cmd = [sys.executable, "-c", "import typer"]
    # a warm-up round fills the page cache and the .pyc files
    times, _ = timed_rounds({"help": lambda _round: run_quietly(help_cmd),
                             "typer": lambda _round: run_quietly(typer_cmd)}, args.runs, warmup=1)
    h, t = statistics.median(times["help"]), statistics.median(times["typer"])
    print(f"distai --help          median {h * 1000:7.1f} ms over {args.runs} runs ({' '.join(help_cmd)})")
    print(f"python -c 'import typer' median {t * 1000:7.1f} ms over {args.runs} runs")
    print(ratio("ratio", h, t, goal=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
