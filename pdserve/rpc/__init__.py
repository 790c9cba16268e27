"""The wire layer: gRPC servers, clients and proto conversion shared by the three services.

The only part of `pdserve/` that imports grpc or the generated stubs; the core never imports it.
"""
