"""The router's workers: the pool and its health watch, breakers per worker and per KV link,
discovery (with the Registry service workers register at), the worker-client interface and its
gRPC implementation (grpc_clients.py, grpc_wire.py, grpc_feed.py: the worker protocol's wire
types stop there), canaries, and the elastic planner's loop."""
