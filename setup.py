"""Maps the repository's top-level folders onto the ``distai.*`` namespace.

``tutor/`` installs as ``distai.tutor``, ``engine/`` as ``distai.engine`` and so on;
``distai`` itself is a namespace package, so nothing generic (``engine``, ``tutor``)
lands at the top of site-packages.
"""
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
SUBPACKAGES = ("tutor", "lessons", "visualizers", "engine")
DATA_PATTERNS = ["*.md", "*.toml", "*.json", "*.tcss"]


def find_packages():
    packages = []
    for top in SUBPACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            packages.append("distai." + ".".join(rel.parts))
    return packages


def package_data():
    """Data files (lesson Markdown in en/ and es/, TOML, CSS) belong to their nearest package."""
    data = {}
    for top in SUBPACKAGES:
        for pattern in DATA_PATTERNS:
            for path in (ROOT / top).rglob(pattern):
                owner = next(p for p in path.parents if (p / "__init__.py").exists())
                pkg = "distai." + ".".join(owner.relative_to(ROOT).parts)
                data.setdefault(pkg, []).append(str(path.relative_to(owner)))
    return {pkg: sorted(files) for pkg, files in data.items()}


setup(
    packages=find_packages(),
    package_dir={f"distai.{top}": top for top in SUBPACKAGES},
    package_data=package_data(),
    include_package_data=False,
)
