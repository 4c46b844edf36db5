"""A step's engine code is read from the file that runs, by qualified name, without importing it."""
from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest

from distai.tutor.code_source import CodeNotFound, read_source


def test_function_source_equals_inspect_getsource():
    import distai.engine.runtime as runtime

    src = read_source("distai.engine.runtime:init_distributed")
    assert src.source == textwrap.dedent(inspect.getsource(runtime.init_distributed)).rstrip("\n")
    assert src.path.resolve() == __import__("pathlib").Path(runtime.__file__).resolve()
    assert src.start_line == inspect.getsourcelines(runtime.init_distributed)[1]


def test_class_and_method_with_decorators():
    import distai.engine.runtime as runtime

    src = read_source("distai.engine.runtime:DistContext")
    assert src.source == textwrap.dedent(inspect.getsource(runtime.DistContext)).rstrip("\n")
    assert src.source.startswith("@dataclass")
    prop = read_source("distai.engine.runtime:DistContext.is_cuda")
    assert prop.source.startswith("@property\ndef is_cuda(self)")  # dedented method


def test_reading_source_does_not_import_the_module():
    res = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from distai.tutor.code_source import read_source
        src = read_source("distai.engine.runtime:init_distributed")
        print(src.qualname, "torch" in sys.modules, "distai.engine.runtime" in sys.modules)
    """)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["init_distributed", "False", "False"]


@pytest.mark.parametrize("spec, message", [
    ("distai.engine.runtime:no_such_function", "distai.engine.runtime has no no_such_function"),
    ("distai.engine.runtime:DistContext.nope", "has no DistContext.nope"),
    ("distai.engine.no_such_module:f", "module distai.engine.no_such_module not found"),
    ("no_such_package.mod:f", "module no_such_package.mod not found"),
    ("distai.engine.runtime", "not of the form 'module:qualname'"),
])
def test_missing_code_gives_a_clear_message(spec, message):
    with pytest.raises(CodeNotFound, match=message.replace(".", r"\.")):
        read_source(spec)


def test_every_code_step_in_the_lessons_names_real_source():
    """Each `code = ...` in a lesson.toml points at a definition, once its module exists."""
    from distai.lessons.registry import all_lessons
    from distai.tutor.code_source import module_file, parse_spec

    for lesson in all_lessons():
        for step in lesson.steps:
            if not step.code:
                continue
            module, _ = parse_spec(step.code)
            try:
                module_file(module)
            except CodeNotFound:
                continue  # the lesson's engine module has not landed yet
            read_source(step.code)  # raises if the name is gone


def test_every_lessons_code_is_read_without_importing_torch():
    """Lesson 4's code lives under distai.engine.tensor_parallel, whose __init__ imports torch: finding its
    file through importlib ran that __init__, and the tutor took 210 MB and 1.6 s to show the step."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from distai.lessons.registry import all_lessons\n"
            "from distai.tutor.code_source import read_source\n"
            "specs = [s.code for l in all_lessons() for s in l.steps if getattr(s, 'code', None)]\n"
            "assert any('tensor_parallel' in c for c in specs), specs\n"
            "for c in specs: read_source(c)\n"
            "print(len(specs), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, torch_loaded = out.stdout.split()
    assert int(count) > 10 and torch_loaded == "False"
