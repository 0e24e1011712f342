"""How many threads llama.cpp runs, and how they wait: the CPUs this process may use, libgomp's barrier.
`batchinfer.backends.llama_engine` re-exports both functions."""

from __future__ import annotations

import os

__all__ = ["BARRIER_SPIN", "barrier_wait_environ", "usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a cgroup or an execution environment pinned
    to one CPU), not the host's count."""
    return len(os.sched_getaffinity(0))


# Iterations libgomp spins at a barrier before it sleeps (its default without a wait policy: 300,000).
BARRIER_SPIN = "2000"


def barrier_wait_environ() -> dict[str, str]:
    """The variables that set how llama.cpp's OpenMP threads wait at a barrier, `{}` when the environment
    sets either already (`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`, GCC's libgomp manual, "Environment
    Variables"): a short spin, then sleep (`GOMP_SPINCOUNT=BARRIER_SPIN`).

    ggml's CPU backend meets its threads at a barrier after every op (~350 per decode call). Sleeping at
    once (`OMP_WAIT_POLICY=PASSIVE`) costs a futex wake each time, slow on a virtual machine's halted
    vCPU; spinning long (libgomp's default) burns the time slice of a partner that is not scheduled.
    Raw 16-sequence decode on this 2-core microVM (`benchmarks.ceiling`): quiet, 186-194
    tokens/s spinning 2,000, 131-148 passive, 189-197 spinning 20,000; at load average 10-14, 23-34,
    29-71 and 9-17. So a host shared with other CPU-bound work sets `OMP_WAIT_POLICY=PASSIVE` (the local
    stack passes it through to its functions).
    """
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    return {"GOMP_SPINCOUNT": BARRIER_SPIN}
