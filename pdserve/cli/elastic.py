"""An elastic worker: `pdserve prefill --elastic` or `pdserve decode --elastic` starts both roles'
parts over one engine (one model, one KV pool, a KV sender and a receiver) and serves the role it
was started as; WorkerControl.SetRole changes it (pdserve/worker/role.py, role_control.py). One
role at a time: a change waits until the old role's requests are done, so the two roles' requests
never share the engine (its prefill requests hold their blocks for the send, Request.sends_kv;
the prefill worker gives back every other hold its steps produce)."""

from __future__ import annotations

import argparse

from decode_service.main import DECODE, decode_parts
from pdserve.rpc.server import ServiceBinding
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker.role import RoleState
from pdserve.worker.role_control import RoleControl, WorkerControlServicer
from pdserve.worker.runtime import RuntimeConfig
from pdserve.worker.service import WorkerService
from pdserve.worker.startup import Role, lay_groundwork, serve_roles
from prefill_service.main import PREFILL, prefill_parts

ELASTIC = Role("elastic", "", lambda servicer, server: None, hold_blocks=False)


async def start_elastic(args: argparse.Namespace, runtime_config: RuntimeConfig, role: str) -> WorkerService:
    if args.transport != "ucx":
        raise SystemExit("an elastic worker sends and receives KV: it needs --transport ucx")
    ground = lay_groundwork(args, runtime_config, ELASTIC)
    prefill, sender = await prefill_parts(ground, args.kv_checksums == "on")
    decode, ends = await decode_parts(args, ground, releases_holds=False, sender=sender)  # the prefill worker releases
    roles = RoleState(role)
    prefill.roles = decode.roles = roles
    control = RoleControl(roles, {"prefill": prefill.in_flight, "decode": decode.in_flight},
                          on_leave={"decode": decode.worker.withdraw_unstarted})
    binding = ServiceBinding(worker_pb2_grpc.add_WorkerControlServicer_to_server, WorkerControlServicer(control),
                             worker_pb2.DESCRIPTOR.services_by_name["WorkerControl"].full_name)
    service = await serve_roles(args, ground, role, [(PREFILL, prefill), (DECODE, decode)],
                                (sender, *ends),
                                lambda: prefill.in_flight() + decode.in_flight(), (binding,))
    control.on_switch = service.registration.set_role
    return service
