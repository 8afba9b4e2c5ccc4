"""The built-in procedurally generated task suite (TB2 folders); see `build.py` and `spec.py`."""
from sandboxes.suite.builder import HELDOUT_OFFSET, build_suite, make_task, split_seeds
from sandboxes.suite.families import FAMILIES
from sandboxes.suite.spec import TaskSpec, write_task

__all__ = ["FAMILIES", "HELDOUT_OFFSET", "TaskSpec", "build_suite", "make_task", "split_seeds", "write_task"]
