"""`bkaio bench`: the latency/throughput harness that measures bkaio against NATS JetStream.

    spec       benchmarks/workloads.toml -> Suite of Workloads
    loads      serial / closed-loop / open-loop load generators (exact latency samples)
    stats      percentiles, per-run results (one JSON line each), medians of the repeats
    procstat   CPU seconds of process trees from /proc
    systems    what a system under test is; bkaio_system and nats_system implement it
    profiling  py-spy recordings and their hot spots
    report     the rich tables, targets verdict, JSON lines and the percentile PNG
    runner     run_bench(options, console): the whole comparison

Used by `bkaio bench` (bkaio/cli/bench_cmd.py). The service never imports this package.
"""
