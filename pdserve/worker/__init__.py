"""What the worker services share beneath their servicers: sessions that turn engine steps into
per-request event streams, leases on what a worker holds for other processes, and the glue
between the engine thread and the KV transport."""
