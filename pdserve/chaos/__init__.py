"""`pdserve chaos`: a seeded schedule of worker faults under load, against real processes.

    config     the frozen configuration; scenarios: named presets and flags laid over them
    schedule   which fault (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) hits which worker when; no overlaps
    load       the requests: chats and documents of mixed priority, half greedy, half seeded
    fleet      the processes: router and workers, as separate commands or under `pdserve up`
    injector   sends the schedule's signals during a run and records when each fault began and ended
    blocks     polls every worker's Stats until none holds an active KV block
    analysis   lost requests, outputs unlike the no-fault run, TBT during and outside faults
    verdict    pass or fail, and why
    harness    the experiment: a no-fault run, then the same requests under the faults
    report     the screen table and the JSON document
"""
