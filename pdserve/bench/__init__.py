"""`pdserve bench`: a gRPC load generator and the policy comparison experiment.

    schedule   the load's schedule (seeded Poisson arrivals, kinds, priorities, sizes), the simulator's too
    workloads  deterministic request mixes (chat, mixed, shared-prefix): the schedule rendered as text
    runner     sends a workload to a router on grpc.aio and records every streamed message
    stats      TTFT / TBT / latency distributions, throughput and goodput per class
    report     the screen table and the JSON document
    compare    starts the service in each configuration and runs the seed's experiment
    plot       TBT over time, one panel per configuration (PNG)
"""
