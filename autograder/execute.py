"""nbgrader's Execute preprocessor, hardened for hostile submissions.

* Before each hidden test cell runs, the grading session writes that test's inputs
  (and nothing else); right after, it takes the results away where the kernel cannot
  reach them. So code in earlier cells cannot see later tests' inputs, and a test's
  results can only come from that test's own run.
* A kernel that dies (``os._exit``, a segfault) does not stop grading: the remaining
  cells are marked as not run, so their tests fail. So does one that runs a cell past its
  time limit and does not come back from the interrupt (native code that never checks for
  signals, SIGINT ignored, a burst held at the memory limit): it is stopped.
* Output is capped per cell, so endless printing cannot exhaust memory.
"""
from __future__ import annotations

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer

from .settings import GraderSettings


class GuardedExecute(Execute):
    """Use ``for_run``: a subclass bound to one grading run (traitlets would deep-copy config values)."""

    session = None  # the GradingSession that feeds the hidden tests
    grading_kernel = None  # the started GradingKernelManager that runs the notebook
    output_cap = Integer(GraderSettings().output_cap,
                         help="Characters of output kept per cell; the rest is dropped with a note.").tag(config=True)

    @classmethod
    def for_run(cls, session, kernel) -> type:
        return type("GuardedExecute", (cls,), {"session": session, "grading_kernel": kernel})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dead = False
        self._interrupted = False  # the running cell passed its time limit and was interrupted
        self._sizes: dict[int, int] = {}

    def preprocess(self, nb, resources=None, km=None):
        self._dead = False
        try:
            return super().preprocess(nb, resources, km or self.grading_kernel)
        except DeadKernelError:
            # Raised again while shutting a dead kernel down: the cells are already marked.
            return nb, resources

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code":
            return cell
        if self._dead:
            cell.outputs = [_error("KernelDied", "the kernel died before this cell ran")]
            return cell
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        session = self.session
        watched = session is not None and session.watches(grade_id)
        if watched:
            session.before_test(grade_id)
        self._interrupted = False
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        except DeadKernelError:
            self._dead = True
            cell.outputs.append(_error("KernelDied", "the kernel died while running this cell"))
            return cell
        except CellTimeoutError:  # nbclient's wait for the cell's last output ran out
            if not self._interrupted:  # the cell had ended (its reply came); its output was late
                return cell
            self._dead = True
            self.km.stop_unresponsive(self.timeout)
            cell.outputs.append(_error("CellTimeoutError", "the cell ran past its time limit and did not "
                                       "stop when interrupted: the kernel was stopped"))
            return cell
        finally:
            if watched:
                session.after_test(grade_id)

    # nbclient binds its sync wrapper to the base coroutine; bind it to ours.
    execute_cell = run_sync(async_execute_cell)

    async def _async_handle_timeout(self, timeout, cell=None):
        """nbclient's step for a cell past its time limit (it interrupts the kernel): noted, so that
        a cell that then does not end is told from one whose output only came late."""
        self._interrupted = True
        return await super()._async_handle_timeout(timeout, cell)

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        size = len(str(content.get("text", ""))) + sum(len(str(v)) for v in content.get("data", {}).values())
        used = self._sizes.get(cell_index, 0)
        self._sizes[cell_index] = used + size
        if used + size <= self.output_cap:
            return super().output(outs, msg, display_id, cell_index)
        if used <= self.output_cap:
            outs.append(NotebookNode(output_type="stream", name="stderr",
                                     text="\n[output truncated by the grader]\n"))
        return None


def _error(name, text):
    return NotebookNode(output_type="error", ename=name, evalue=text, traceback=[f"{name}: {text}"])
