"""torchrun's agent for `execpar launch` on a CPU host: it imports what every rank imports
(torch, its distributed, dynamo and DTensor modules, execpar's trainer) before torchrun's main,
which then forks each rank from this process (--start-method fork --run-path execpar/cli.py).
A rank started as a new interpreter (torchrun -m execpar.cli run) imports all of that again:
5 s of CPU a rank, which on a CPU host the ranks then share the cores with; forked, it starts
with them loaded (a 2-rank run of a tiny model: 16.7 s of CPU before, 6.9 s forked from here).
GPU hosts keep torchrun's own agent and a fresh interpreter a rank: there the import is noise
beside the job, and no process that may have touched CUDA should fork."""

from torch.distributed.run import main

import execpar.train  # noqa: F401  (loaded here once, for the ranks forked from this process)

if __name__ == "__main__":
    main()
