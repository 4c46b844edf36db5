"""The wheel installs everything under the `distai.` namespace and nothing generic."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from distai.lessons.registry import all_lessons

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tutor", "lessons", "visualizers", "engine")
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".hypothesis", ".benchmarks", "__snapshots__")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the source tree (the checkout stays untouched)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    out = work / "dist"
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", str(out), str(src)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (whl,) = out.glob("distai-*.whl")
    return whl


def test_wheel_has_everything_under_the_distai_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = [n for n in names if ".dist-info/" in n]
    payload = [n for n in names if n not in dist_info]
    assert payload and all(n.startswith("distai/") for n in payload), \
        sorted({n.split("/")[0] for n in payload})
    assert "distai/__init__.py" not in names  # distai is a namespace package
    for top in FOLDERS + ("tests", "bench"):
        assert not any(n.startswith(top + "/") for n in names)

    # every Python module and data file of the source tree is in the wheel
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".toml", ".json", ".tcss") and "__pycache__" not in path.parts:
                rel = "distai/" + path.relative_to(ROOT).as_posix()
                assert rel in names, f"{rel} missing from the wheel"

    for must in ("distai/tutor/cli.py", "distai/tutor/app.py", "distai/tutor/app.tcss",
                 "distai/tutor/progress.py", "distai/engine/runtime.py",
                 "distai/visualizers/base.py", "distai/lessons/registry.py"):
        assert must in names
    for lesson in all_lessons():
        folder = lesson.package.rsplit(".", 1)[-1]
        assert f"distai/lessons/{folder}/lesson.toml" in names
    lesson1 = next(l for l in all_lessons() if l.id == "lesson1")
    for step in lesson1.steps:
        for lang in ("en", "es"):
            assert f"distai/lessons/lesson1/{lang}/{step.key}.md" in names

    entry_points = next(n for n in dist_info if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "distai = distai.tutor.entry:main" in text


def test_installed_wheel_works_without_the_checkout(wheel, tmp_path):
    """Unpacked alone on sys.path, the wheel's distai.* imports and lists the lessons."""
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "import distai.tutor.cli as c, distai.lessons.registry as r;"
            "assert c.__file__.startswith(sys.argv[1]), c.__file__;"
            "print(len(r.all_lessons()), r.resolve_lesson('ring-allreduce').step_text('replicate', 'es')[:1])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -S: no site-packages, so the editable install of this checkout cannot answer;
    # the wheel's own dependencies (typer, ...) come from the interpreter's site dir, appended last.
    import site

    res = subprocess.run([sys.executable, "-S", "-c",
                          f"import sys; sys.path += {site.getsitepackages()!r}; " + code, str(target)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[0] == str(len(all_lessons()))  # every lesson of the checkout
