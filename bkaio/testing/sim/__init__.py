"""Deterministic simulation of the real bookie and client code (docs/faults.md).

    make sim SEEDS=1000        # python -m bkaio.testing.sim --seeds 1000 --mutation-checks 1000
    make sim SEED=1234         # one seed, its report and the line that replays it

The parts, bottom up: `loop` (virtual time, seeded scheduler), `process` (simulated processes
and what dies with them), `guards` (no real thread, socket or sleep inside), `threads` (the
storage and journal threads as loop jobs), `disk` (the `Disk` seam with a crash model),
`network` (in-memory TCP), `meta` (an in-memory metadata driver), `nodes` (a bookie machine and
a client process built from the production classes), `cluster` (one simulated cluster and its
final phase), `workload` and `scenarios` (what a seed does), `runner` (one seed, judged by the
history checker), `pool` (many seeds in forked workers) and `__main__` (the command).
"""
