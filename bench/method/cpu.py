"""A process's or one of its threads' CPU time, to the nanosecond: Linux's per-process
CPU clock (the one glibc's `clock_getcpuclockid` names) and a thread's scheduler runtime.
psutil and /proc/PID/stat count whole clock ticks (10 ms), too coarse for a short window:
a process that ran 8 ms in it reads 0 or 10."""

from __future__ import annotations

import time

# linux/include/linux/posix-timers.h: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED).
_CPUCLOCK_SCHED = 2


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`: every thread's, exited ones' included,
    children not. OSError once the process is gone."""
    return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU seconds of one thread of process `pid` (its main thread by default), to the
    nanosecond: the scheduler's runtime in /proc (schedstat). Linux serves a thread's CPU
    clock only to its own process; a thread running right now reads its time up to its
    last scheduler update (a tick at most). OSError once the thread is gone."""
    with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e9
