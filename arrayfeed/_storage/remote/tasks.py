"""Requests a failed call leaves running on an event loop: ended, not abandoned.

zarr-python reads a store's metadata with several requests at once (``asyncio.gather``); when one
fails, the others go on running on zarr's event loop thread, retrying against an endpoint that
does not answer. If the interpreter exits meanwhile, Python destroys them half-way and prints a
traceback for each ("Exception ignored in: <coroutine object StorePath.get ...>"). Calls made
under :func:`ending` record the tasks they start; if the call fails, those still running are
cancelled and waited for, so that the named error is all that remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

__all__ = ["ending"]

#: Tasks started under :func:`ending`, in the context of the call that starts them; a task
#: created on the loop copies its creator's context, so the tasks a task starts are seen too.
_STARTED: contextvars.ContextVar[list[asyncio.Future[Any]] | None] = contextvars.ContextVar(
    "arrayfeed_started_tasks", default=None
)

#: Seconds to wait for cancelled tasks to end (cancellation only unwinds their ``finally``).
_END_WAIT = 10.0

#: Runs a coroutine to its end on the event loop in question, from another thread.
Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@contextlib.contextmanager
def ending(run: Runner) -> Iterator[None]:
    """Record the tasks started on ``run``'s event loop by the calls in this block; if the block
    raises, cancel those still running and wait for them to end before the error goes on."""
    run(_watch())
    started: list[asyncio.Future[Any]] = []
    token = _STARTED.set(started)
    try:
        yield
    except BaseException:
        _STARTED.reset(token)  # before ending them: the tasks that end them are not theirs
        if any(not task.done() for task in started):
            with contextlib.suppress(Exception):
                run(asyncio.wait_for(_end(list(started)), _END_WAIT))
        raise
    else:
        _STARTED.reset(token)


async def _watch() -> None:
    """Make the running loop record the tasks started under :func:`ending` (once per loop)."""
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    if getattr(factory, "records_started", False):
        return

    def create(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any]
        if factory is not None:
            task = factory(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        started = _STARTED.get()
        if started is not None:
            started.append(task)
        return task

    create.records_started = True  # type: ignore[attr-defined]
    loop.set_task_factory(create)  # type: ignore[arg-type]


async def _end(tasks: list[asyncio.Future[Any]]) -> None:
    running = [task for task in tasks if not task.done()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
