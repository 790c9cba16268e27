"""What the worker services share beneath their roles: the table of live requests and the
sessions that turn engine steps into per-request event streams, leases on what a worker holds
for other processes, the RPCs both answer alike, and how a worker process starts and stops."""
