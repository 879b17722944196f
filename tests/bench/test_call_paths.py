"""bench.micro.call_paths counts the files a call enters, merging repeated calls along one path."""

from __future__ import annotations

from types import FunctionType

from bench.micro.call_paths import Trace

B = """
def leaf():
    return 1

def back(f):
    return f()
"""

A = """
def helper():
    return 2

def top(b):
    for _ in range(3):
        b.leaf()
    b.back(helper)
    return b.leaf() + len(sorted([3, 1], key=lambda x: x))
"""


class Module:
    """Functions compiled as if from the file ``name``."""

    def __init__(self, name: str, source: str) -> None:
        space: dict[str, object] = {}
        exec(compile(source, name, "exec"), space)
        self.__dict__.update({k: v for k, v in space.items() if isinstance(v, FunctionType)})


def test_a_file_called_again_or_called_back_is_a_re_entry_and_a_loop_is_one_path():
    a, b = Module("a.py", A), Module("b.py", B)
    trace = Trace(lambda name: name if name in {"a.py", "b.py"} else None)
    with trace.record():
        a.top(b)
    # a.top, then b.leaf (three times in a loop and once after: one path), b.back, and back into
    # a.helper from b; the lambda is a.py's own, called through sorted (not a project file)
    assert trace.summary() == {"files": 2, "entries": 4, "re_entries": 2, "dynamic_entries": 7,
                               "per_file": {"a.py": 2, "b.py": 2}}
    assert trace.lines() == [">> a.py:top", "  >> b.py:leaf", "  >> b.py:back", "    >> a.py:helper",
                             "     a.py:top.<locals>.<lambda>"]
