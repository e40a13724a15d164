"""Running studies: the runner (plan, loop, resume), the executor (launch and collect) and
the launchers (local, Slurm, PBS)."""
