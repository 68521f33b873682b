"""A process's CPU time, to the nanosecond: Linux's per-process CPU clock, the one glibc's
`clock_getcpuclockid` names. psutil and /proc/PID/stat count whole clock ticks (10 ms),
too coarse for a short window: a process that ran 8 ms in it reads 0 or 10."""

from __future__ import annotations

import time

# linux/include/linux/posix-timers.h: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), and
# MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) with CPUCLOCK_PERTHREAD_MASK.
_CPUCLOCK_SCHED = 2
_CPUCLOCK_PERTHREAD = 4


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`: every thread's, exited ones' included,
    children not. OSError once the process is gone."""
    return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)


def thread_cpu_seconds(tid: int) -> float:
    """User + system CPU seconds of thread `tid` (a process's main thread has its pid).
    OSError once the thread is gone."""
    return time.clock_gettime((~tid << 3) | _CPUCLOCK_PERTHREAD | _CPUCLOCK_SCHED)
