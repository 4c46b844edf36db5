"""How long `distai --help` takes next to a bare `python -c "import typer"`.

Goal (issue 2): `distai --help` within about 4x the bare Typer import. Both are run as fresh
processes, interleaved, and the medians compared. Usage: python bench/cli_startup.py [--runs N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def distai_command() -> list[str]:
    script = Path(sys.executable).with_name("distai")
    if script.exists():
        return [str(script), "--help"]
    found = shutil.which("distai")
    return [found, "--help"] if found else [sys.executable, "-m", "distai.tutor.cli", "--help"]


def wall(cmd: list[str]) -> float:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="0")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    help_cmd = distai_command()
    typer_cmd = [sys.executable, "-c", "import typer"]
    for cmd in (help_cmd, typer_cmd):  # warm the page cache and .pyc files
        wall(cmd)
    help_times, typer_times = [], []
    for _ in range(args.runs):
        help_times.append(wall(help_cmd))
        typer_times.append(wall(typer_cmd))
    h, t = statistics.median(help_times), statistics.median(typer_times)
    print(f"distai --help          median {h * 1000:7.1f} ms over {args.runs} runs ({' '.join(help_cmd)})")
    print(f"python -c 'import typer' median {t * 1000:7.1f} ms over {args.runs} runs")
    print(f"ratio {h / t:.2f}x (goal <= 4x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
