"""Reports of errors jaxformer already reports itself, dropped: for the process, or for one call.

A failed restore's abandoned reads report after the fact.

When one array of a step fails to restore, Orbax closes the event loop of that restore while TensorStore is still
reading the step's other arrays. Each of those reads, when it completes on TensorStore's thread, reports
``RuntimeError: Event loop is closed`` as an unraisable exception, or, when it failed too, asyncio logs "Future (or
Task) exception was never retrieved"; a read closed unfinished (Orbax's ``_read_array_index_and_device_put``
coroutine, an array of another shape) raises its error again as an unraisable exception as it is collected, and one
never started (Orbax's ``_get_array_metadatas``) warns at exit that it was never awaited: tracebacks and lines
printed after the command's one-line error, or pytest warnings. The reads' results are not wanted (the step is
already judged unreadable, `jaxformer.train.checkpoint`), so those reports are dropped; every other goes on as
before.

A process the project owns (the `jaxformer` command, a sweep's worker) drops them for good
(`ignore_reads_outliving_their_loop`). A library call (`train`, `restore_params`, `Checkpointer.restore_latest`)
drops them while it runs (`reads_outliving_their_loop_ignored`) and gives its caller back their
``sys.unraisablehook`` and asyncio log filters when it returns; it leaves their warning filters alone (the warning of
a read never begun comes as the coroutine is collected, at exit mostly). This module imports only the standard
library: the command installs it before it knows whether anything will restore.

A failed checkpoint write (a full disk) or Ctrl-C during one is logged by Orbax, through absl's logger, with its
traceback in each thread it reaches; `jaxformer.train.checkpoint.Checkpointer` raises it once, in one line. The same
two ways drop Orbax's records of those errors: for the process (`ignore_failed_write_tracebacks`, the command and the
sweep worker) or while a library call runs (`failed_write_tracebacks_ignored`: `train`, `train_together`, a
`Checkpointer`'s writes), which gives the caller back absl's logger filters as they were.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import warnings
from typing import Any, Iterator

# the metadata read of a restore abandoned before it began, collected at exit ("sys:1: RuntimeWarning: …")
_UNSTARTED_READ = r"coroutine '\S*_get_array_metadatas' was never awaited"
# TensorStore reports a file system's error as a ValueError: "RESOURCE_EXHAUSTED: … [os_error_code='28']"
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_ORBAX = f"{os.sep}orbax{os.sep}"


def _unraisable_read_after_its_loop(unraisable: Any) -> bool:
    if getattr(unraisable.object, "__qualname__", None) == "_read_array_index_and_device_put":
        return True  # a read of a failed restore, closed unfinished: its error is the step's, already reported
    return (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed")


def _keeps_log_record(record: logging.LogRecord) -> bool:
    """False for asyncio's note on a TensorStore read's failure that nobody awaited any more."""
    error = record.exc_info[1] if record.exc_info else None
    return not (record.getMessage().startswith(("Future exception was never retrieved",
                                                "Task exception was never retrieved"))
                and error is not None and "tensorstore_spec" in str(error))


def _drops(hook: Any) -> bool:
    return getattr(hook, "drops_reads_after_their_loop", False)


def ignore_reads_outliving_their_loop() -> None:
    """Drops the four late reports for the rest of the process (`reads_outliving_their_loop_ignored`'s two, and the
    warning of a read never begun)."""
    warnings.filterwarnings("ignore", _UNSTARTED_READ, RuntimeWarning)  # each time: a caller may reset the filters
    _drop_unraisable_and_logged()


@contextlib.contextmanager
def reads_outliving_their_loop_ignored() -> Iterator[None]:
    """The unraisable and logged late reports dropped inside the block (also a decorator); after it, the caller's
    ``sys.unraisablehook`` (unless they set another inside) and asyncio log filters are as they were. Where the
    process drops them for good, nothing changes."""
    hook, asyncio_log = sys.unraisablehook, logging.getLogger("asyncio")
    filtered = _keeps_log_record in asyncio_log.filters
    _drop_unraisable_and_logged()
    try:
        yield
    finally:
        if _drops(sys.unraisablehook) and not _drops(hook):
            sys.unraisablehook = hook
        if not filtered:
            asyncio_log.removeFilter(_keeps_log_record)


def _drop_unraisable_and_logged() -> None:
    logging.getLogger("asyncio").addFilter(_keeps_log_record)  # once: a logger keeps one of each filter
    previous = sys.unraisablehook
    if _drops(previous):
        return

    def hook(unraisable: Any) -> None:
        if not _unraisable_read_after_its_loop(unraisable):
            previous(unraisable)

    hook.drops_reads_after_their_loop = True
    sys.unraisablehook = hook


def failed_write_errno(error: BaseException) -> int | None:
    """The errno of a failed Orbax write (an ``OSError``, or TensorStore's ValueError naming one); None for any
    other error."""
    if isinstance(error, OSError):
        return error.errno
    if not isinstance(error, ValueError):
        return None
    text = str(error)
    if code := _OS_ERROR_CODE.search(text):
        return int(code.group(1))
    return errno.ENOSPC if "RESOURCE_EXHAUSTED" in text or "No space left" in text else None


def _keeps_absl_record(record: logging.LogRecord) -> bool:
    """False for Orbax's own traceback of an error `Checkpointer` raises itself: a failed write (`failed_write_errno`),
    or Ctrl-C while it waited for a save; every other record (another library's, a plain one) is kept."""
    error = record.exc_info[1] if record.exc_info else None
    if error is None or _ORBAX not in record.pathname:
        return True
    return not (isinstance(error, KeyboardInterrupt) or failed_write_errno(error) is not None)


def ignore_failed_write_tracebacks() -> None:
    """Drops Orbax's tracebacks of the errors a `Checkpointer` raises itself for the rest of the process."""
    logging.getLogger("absl").addFilter(_keeps_absl_record)  # once: a logger keeps one of each filter


@contextlib.contextmanager
def failed_write_tracebacks_ignored() -> Iterator[None]:
    """Orbax's tracebacks of the errors a `Checkpointer` raises itself dropped inside the block (also a decorator);
    after it, absl's logger filters are as they were. Where the process drops them for good, nothing changes."""
    absl_log = logging.getLogger("absl")
    filtered = _keeps_absl_record in absl_log.filters
    absl_log.addFilter(_keeps_absl_record)
    try:
        yield
    finally:
        if not filtered:
            absl_log.removeFilter(_keeps_absl_record)
