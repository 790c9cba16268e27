"""Processes of a running service, seen from outside: start and supervise them (supervisor.py),
wait until a router serves (health.py), run a whole `pdserve up` as one child (up_process.py).

Mechanism shared by the CLI (`pdserve up`), the benchmarks (`pdserve bench --compare`), the chaos
harness and the tests; it sits below all of them and starts pdserve by command line, never by
importing pdserve.cli.
"""
