"""Nothing in the executor waits forever: a watchdog on the interchange and deadline-bound I/O.

HTEX talks to its interchange (a separate process) through ZMQ sockets that block without
limit: the task channel is a DEALER socket whose ``send`` waits for a peer, the command channel
a REQ socket that waits for a reply. When the interchange dies, every caller of these sockets
(the node monitor's ``MANAGERS`` query, ``submit_to_node``, a rank launch of the control loop)
would hang for good and no task would ever fail. This module gives the executor

* :class:`InterchangeWatchdog`: a thread that polls the interchange process and calls back with
  an :class:`InterchangeLostError` naming its exit code or signal the moment it exits;
* :func:`send_with_deadline`: a task-channel put that gives up after a deadline (or at once
  when the executor is already known to be broken) instead of blocking;
* :func:`command_with_deadline`: a command-channel request with a deadline, turning Parsl's
  ``CommandClientTimeoutError`` into an :class:`InterchangeLostError` (a client that timed out
  is unusable for good: Parsl marks it bad, so an unanswered command means a lost interchange).

The executor's reaction to a lost interchange is Parsl's own ``set_bad_state_and_fail_all``:
every in-flight and queued task fails with the cause, new submissions raise it at once, and the
control loop fails every malleable job with a :class:`~malleparsl.executors.driver.JobAbortedError`
that names it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from malleparsl.errors import MalleparslError

log = logging.getLogger(__name__)


class InterchangeLostError(MalleparslError, RuntimeError):
    """The executor's interchange process exited or stopped answering: no task can run any more.

    Every task and malleable job of the executor fails with this cause; start a new executor
    (a new ``parsl.load``) to go on.
    """


class DeadlineError(MalleparslError, TimeoutError):
    """A blocking call of the executor did not complete within its deadline."""


def describe_exit(returncode: int) -> str:
    """``"was killed by SIGKILL"`` or ``"exited with status 3"``: what ``Popen.returncode`` means."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class InterchangeWatchdog:
    """Polls a process every ``period_s`` and calls ``on_lost(error)`` once when it has exited.

    Parameters
    ----------
    process : callable
        Returns the ``subprocess.Popen`` of the interchange (or ``None`` while not started).
    on_lost : callable
        Called from the watchdog thread with an :class:`InterchangeLostError`.
    label : str
        The executor's label, for the message.
    period_s : float
        How often to look; the process table is cheap to read.
    """

    def __init__(
        self,
        *,
        process: Callable[[], Any],
        on_lost: Callable[[InterchangeLostError], None],
        label: str,
        period_s: float = 0.2,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0 seconds, got {period_s!r}")
        self.process = process
        self.on_lost = on_lost
        self.label = label
        self.period_s = period_s
        self.fired: InterchangeLostError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="malleparsl-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching (the executor is about to terminate the interchange itself)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def check(self) -> InterchangeLostError | None:
        """The error to raise if the interchange has exited, else ``None`` (no side effects)."""
        proc = self.process()
        if proc is None:
            return None
        rc = proc.poll()
        if rc is None:
            return None
        return InterchangeLostError(
            f"the interchange of executor {self.label!r} (pid {proc.pid}) {describe_exit(rc)}; "
            "every running and queued task and malleable job of this executor fails, and new "
            "submissions are refused: start a new executor to go on"
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                err = self.check()
            except Exception:  # never let the watchdog die silently
                log.exception("interchange watchdog: check failed")
                continue
            if err is not None and not self._stop.is_set():
                self.fired = err
                log.error("%s", err)
                try:
                    self.on_lost(err)
                except Exception:
                    log.exception("interchange watchdog: reaction to the loss failed")
                return


def send_with_deadline(
    sock: Any,
    message: Any,
    *,
    timeout_s: float,
    broken: Callable[[], BaseException | None],
    poll_ms: int = 100,
) -> None:
    """``sock.send_pyobj(message)`` that never blocks for good.

    Waits for the socket to accept the message in slices of ``poll_ms``; raises what
    ``broken()`` returns as soon as it returns an exception (the executor learned that the
    interchange is gone), and :class:`DeadlineError` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        err = broken()
        if err is not None:
            raise err
        if sock.poll(timeout=poll_ms, flags=zmq.POLLOUT) & zmq.POLLOUT:
            try:
                sock.send_pyobj(message, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
        if time.monotonic() > deadline:
            raise DeadlineError(
                f"the interchange did not accept a task message within {timeout_s} s "
                "(put_timeout_s); it is considered lost"
            )


def command_with_deadline(client: Any, command: Any, *, timeout_s: float) -> Any:
    """``client.run(command)`` with a deadline; an unanswered command means a lost interchange."""
    from parsl.executors.high_throughput.errors import (
        CommandClientBadError,
        CommandClientTimeoutError,
    )

    try:
        return client.run(command, timeout_s=timeout_s)
    except (CommandClientTimeoutError, CommandClientBadError) as exc:
        raise InterchangeLostError(
            f"the interchange did not answer {command!r} within {timeout_s} s "
            f"(command_timeout_s): {type(exc).__name__}"
        ) from exc
