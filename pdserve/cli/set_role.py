"""`pdserve set-role --worker HOST:PORT --role prefill|decode`: change an elastic worker's role
(WorkerControl.SetRole, an internal call: the cluster token or a client certificate). It stops
taking work of its role at once and serves the other once that work is done; naming its current
role calls a change under way off. Prints what it serves now and next."""

from __future__ import annotations

import argparse
import asyncio
import sys

from pdserve.rpc.security import add_security_flags


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="change an elastic worker's role (prefill or decode)")
    p.add_argument("--worker", required=True, help="host:port of a worker started with --elastic")
    p.add_argument("--role", required=True, choices=["prefill", "decode"])
    p.add_argument("--timeout-s", type=float, default=10.0)
    add_security_flags(p, api_token=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import grpc

    try:
        role, next_role = asyncio.run(_set_role(args))
    except grpc.aio.AioRpcError as exc:
        hint = " (not an elastic worker?)" if exc.code() == grpc.StatusCode.UNIMPLEMENTED else ""
        print(f"error: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
        return 1
    print(f"{args.worker}: serves {role}" + (f", becoming {next_role} once its {role} work is done" if next_role else ""))
    return 0


async def _set_role(args: argparse.Namespace) -> tuple[str, str]:
    from pdserve.rpc.channels import ChannelPool
    from pdserve.rpc.security import security_from_args
    from pdserve.v1 import worker_pb2 as wpb
    from pdserve.v1 import worker_pb2_grpc

    channels = ChannelPool(security_from_args(args))
    try:
        stub = worker_pb2_grpc.WorkerControlStub(channels.get(args.worker))
        response = await stub.SetRole(wpb.SetRoleRequest(role=args.role), timeout=args.timeout_s)
    finally:
        await channels.close()
    return response.role, response.next_role
