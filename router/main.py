"""Starts the router: tokenizer and limits of the model, worker discovery, the public gRPC server
(Generation) and, with --internal-port, the internal one (Registry)."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field

from pdserve.validation import Limits
from pdserve.requests import Priority
from pdserve.checkpoint.source import read_model_config
from pdserve.identity import model_fingerprint
from pdserve.procs.collector import quiet_collector
from pdserve.rpc.channels import ChannelPool, split_addresses
from pdserve.rpc.drain import Drain
from pdserve.rpc.security import Security, security_from_args
from pdserve.rpc.server import RunningServer, ServiceBinding, start_server
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2, generation_pb2_grpc, worker_pb2, worker_pb2_grpc
from pdserve.worker.observability import Observability, start_observability
from router.doors.frontend import Frontend
from router.doors.limits import limits_from_args
from router.fleet.canary import CANARY_TEXT, Canaries, CanaryConfig
from router.fleet.discovery import DnsDiscovery, RegistryServicer
from router.fleet.grpc_clients import GrpcWorkerClients
from router.flow.flow import RequestFlow
from router.flow.flow_types import FlowConfig, OnLeave, ReserveAt
from pdserve.elastic import PlannerPolicy
from router.doors.gateway import Gateway
from router.doors.http.app import HttpApi, HttpServer, HttpSettings, max_body_bytes, start_http
from router.doors.servicer import GenerationServicer
from router.doors.tenants import open_tenants, read_tenants
from router.fleet.planning import Planner
from router.fleet.workers import WorkerPool
from router.flow.recovery import RecoveryPolicy
from router.placement.admission_flags import admission_from_args
from router.placement.local_prefill import local_prefill_from_args
from router.telemetry import RequestTrace


@dataclass
class RouterService:
    server: RunningServer
    pool: WorkerPool
    channels: ChannelPool
    observability: Observability
    gateway: Gateway
    drainer: Drain
    discoveries: list[DnsDiscovery] = field(default_factory=list)
    internal: RunningServer | None = None  # Registry and health, on --internal-port
    http: HttpServer | None = None  # the OpenAI-compatible API, on --http-port
    planner: Planner | None = None  # role changes of elastic workers (--planner)
    canaries: Canaries | None = None  # a fixed prompt through every pair (--canary-interval-s)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def internal_port(self) -> int | None:
        return self.internal.port if self.internal is not None else None

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    @property
    def metrics_port(self) -> int | None:
        return self.observability.metrics_port

    async def drain(self, timeout_s: float) -> int:
        self.drainer.draining = True
        await self.server.set_serving(False)
        return await self.drainer.wait_idle(lambda: len(self.gateway.active), timeout_s)

    async def stop(self) -> None:
        for discovery in self.discoveries:
            discovery.stop()
        if self.planner is not None:
            await self.planner.stop()
        if self.canaries is not None:
            await self.canaries.stop()
        await self.pool.stop()
        if self.http is not None:
            await self.http.stop()
        if self.internal is not None:
            await self.internal.stop(1.0)
        await self.server.stop(1.0)
        await self.channels.close()
        self.gateway.frontend.close()
        self.observability.stop()


async def start_router(args: argparse.Namespace) -> RouterService:
    tenants = read_tenants(args.api_token_file) if args.api_token_file else \
        open_tenants(Priority[args.anonymous_max_priority.upper()])
    security = security_from_args(args, tenants.tokens)
    config = read_model_config(args.model)
    frontend = Frontend(load_tokenizer(args.model),
                        Limits(config.vocab_size, config.max_position_embeddings, args.kv_capacity_tokens),
                        limits_from_args(args))
    channels = ChannelPool(security)
    clients = GrpcWorkerClients(channels, feeds=args.event_feeds == "on")
    drainer = Drain()
    sync: list = []
    obs = start_observability("pdserve-router", args)
    pool = WorkerPool(clients, [] if args.colocated else split_addresses(args.prefill_workers),
                      split_addresses(args.decode_workers), on_change=lambda: sync and sync[0](),
                      model=model_fingerprint(args.model),
                      on_incompatible=lambda w: obs.metrics.count_incompatible_worker(w.role, w.incompatible))
    recovery = RecoveryPolicy(resume_on_decode_failure=args.decode_failover == "resume",
                              eos_token_ids=tuple(config.eos_token_ids))
    flow = RequestFlow(pool, clients, FlowConfig(colocated=args.colocated, kv_timeout_s=args.kv_timeout,
                                                 wait_for_worker_s=args.wait_for_worker_s,
                                                 resume_wait_s=args.resume_wait_s, recovery=recovery,
                                                 local_prefill=local_prefill_from_args(args),
                                                 admission=admission_from_args(args),
                                                 on_leave=OnLeave(args.on_leave),
                                                 gather_tokens=args.stream_interval.gather_tokens,
                                                 reserve_at=ReserveAt(args.reserve_at),
                                                 rebalance_interval_s=args.rebalance_interval_s or None))
    tracer = obs.tracing.tracer()
    gateway = Gateway(frontend, flow, lambda md: RequestTrace(tracer, obs.metrics, config.name, md),
                      drainer, args.max_active, tenants, interval=args.stream_interval)
    bindings = [ServiceBinding(generation_pb2_grpc.add_GenerationServicer_to_server, GenerationServicer(gateway),
                               generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name)]
    server = await start_server(bindings, args.host, args.port, security.server_credentials(),
                                security.server_interceptors(), args.health_port)
    internal = await _start_registry(pool, security, args)
    ready = (lambda: bool(pool.of_role("decode"))) if args.colocated else (lambda: pool.ready)
    sync.append(lambda: asyncio.ensure_future(server.set_serving(ready() and not drainer.draining)))
    http = await _start_http(gateway, config, args, security, lambda: ready() and not drainer.draining, obs)
    discoveries = _dns(pool, args)
    pool.start()
    planner = _planner(pool, clients, obs, flow.config, args)
    canaries = Canaries(pool, flow, tuple(frontend.tokenizer.encode(CANARY_TEXT)),
                        CanaryConfig(interval_s=args.canary_interval_s or None), obs.metrics.count_canary)
    canaries.start()
    quiet_collector()
    return RouterService(server, pool, channels, obs, gateway, drainer, discoveries, internal, http, planner,
                         canaries)


def _planner(pool: WorkerPool, clients: GrpcWorkerClients, obs, config: FlowConfig,
             args: argparse.Namespace) -> Planner | None:
    """With --planner: the loop that changes elastic workers' roles, its TBT limit the NORMAL
    class's objective (if any)."""
    if not args.planner:
        return None
    policy = PlannerPolicy(tbt_objective_s=config.admission.objectives.of(Priority.NORMAL).tbt_s)
    planner = Planner(pool, clients, policy, obs.metrics, obs.tracing.tracer(), args.planner_period_s)
    planner.start()
    return planner


async def _start_http(gateway: Gateway, config, args: argparse.Namespace, security: Security,
                      serving, obs: Observability) -> HttpServer | None:
    if args.http_port is None:
        return None
    tokenizer = gateway.frontend.tokenizer
    settings = HttpSettings(obs.metrics.model_name, config.max_position_embeddings, max_body_bytes(gateway.inputs))
    api = HttpApi(gateway, settings, lambda token: tokenizer.decode([token], skip_special_tokens=False), serving,
                  obs.metrics.exposition)
    return await start_http(api, args.host, args.http_port, security.ssl_context())


async def _start_registry(pool: WorkerPool, security: Security, args: argparse.Namespace) -> RunningServer | None:
    """The internal server: Registry and health only, behind the cluster token."""
    if args.internal_port is None:
        return None
    registry = RegistryServicer(pool, args.max_registered_workers)
    binding = ServiceBinding(worker_pb2_grpc.add_RegistryServicer_to_server, registry,
                             worker_pb2.DESCRIPTOR.services_by_name["Registry"].full_name)
    internal = await start_server([binding], args.host, args.internal_port, security.server_credentials(),
                                  security.server_interceptors())
    await internal.set_serving(True)
    return internal


def _dns(pool: WorkerPool, args: argparse.Namespace) -> list[DnsDiscovery]:
    found = [DnsDiscovery(pool, role, target, args.dns_refresh_s)
             for role, target in (("prefill", args.prefill_dns), ("decode", args.decode_dns)) if target]
    for discovery in found:
        discovery.start()
    return found
