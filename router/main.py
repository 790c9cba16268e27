"""Starts the router: tokenizer and limits of the model, worker pool, public gRPC server."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from pdserve.engine.validation import Limits
from pdserve.model.metadata import read_model_config
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.server import RunningServer, ServiceBinding, start_server
from pdserve.worker.observability import Observability, start_observability
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.flow import FlowConfig, RequestFlow
from router.frontend import Frontend
from router.servicer import GenerationServicer
from router.telemetry import RequestTrace
from router.workers import WorkerPool


@dataclass
class RouterService:
    server: RunningServer
    pool: WorkerPool
    channels: ChannelPool
    observability: Observability

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        return self.observability.metrics_port

    async def stop(self) -> None:
        await self.pool.stop()
        await self.server.stop(1.0)
        await self.channels.close()
        self.observability.stop()


def _addresses(value: str) -> list[str]:
    return [a.strip() for a in value.split(",") if a.strip()]


async def start_router(args: argparse.Namespace) -> RouterService:
    config = read_model_config(args.model)
    limits = Limits(config.vocab_size, config.max_position_embeddings, args.kv_capacity_tokens)
    frontend = Frontend(load_tokenizer(args.model), limits)
    channels = ChannelPool()
    holder: dict = {}
    pool = WorkerPool(channels, [] if args.colocated else _addresses(args.prefill_workers),
                      _addresses(args.decode_workers), on_change=lambda: holder.get("sync", lambda: None)())
    flow = RequestFlow(pool, FlowConfig(colocated=args.colocated,
                                        resume_on_decode_failure=args.decode_failover == "resume",
                                        kv_timeout_s=args.kv_timeout))
    obs = start_observability("pdserve-router", args)
    tracer = obs.tracing.tracer()
    servicer = GenerationServicer(frontend, flow, lambda md: RequestTrace(tracer, obs.metrics, config.name, md),
                                  args.max_active)
    name = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name
    server = await start_server([ServiceBinding(generation_pb2_grpc.add_GenerationServicer_to_server, servicer, name)],
                                args.host, args.port)
    ready = _readiness(pool, args.colocated)
    holder["sync"] = lambda: asyncio.ensure_future(server.set_serving(ready()))
    pool.start()
    return RouterService(server, pool, channels, obs)


def _readiness(pool: WorkerPool, colocated: bool):
    if colocated:
        return lambda: bool(pool.of_role("decode"))
    return lambda: pool.ready
