"""Tracing and the /metrics endpoint of one service process, built from its flags and env."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pdserve.checkpoint.source import served_name
from pdserve.telemetry import Metrics, MetricsServer, Tracing, setup_tracing


@dataclass
class Observability:
    tracing: Tracing
    metrics: Metrics
    server: MetricsServer | None

    @property
    def metrics_port(self) -> int | None:
        return self.server.port if self.server else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.tracing.shutdown()


def model_name(args: argparse.Namespace) -> str:
    """The name clients call the model by (`--served-model-name`, else its folder or file name):
    the router's /v1/models and every role's `model_name` label."""
    return args.served_model_name or served_name(args.model)


def metrics_from_args(args: argparse.Namespace) -> Metrics:
    return Metrics(model_name(args), vllm_names=args.vllm_metric_names)


def start_observability(service_name: str, args: argparse.Namespace) -> Observability:
    metrics = metrics_from_args(args)
    server = None
    if args.metrics_port is not None:
        server = metrics.serve(args.metrics_port, getattr(args, "metrics_host", None) or args.host)
    return Observability(setup_tracing(service_name, args.otlp_traces_endpoint), metrics, server)
