"""`pdserve serve [MODEL]`: the whole service on this machine, as `vllm serve MODEL` starts one:
`pdserve up` with the model as its first argument (a .gguf file or a Hugging Face model folder;
none: the embedded model) and the OpenAI API on port 8000. Every `pdserve up` flag applies."""

from __future__ import annotations

import argparse

from pdserve.cli import up


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="start the whole service for MODEL, the OpenAI API on :8000 (as `vllm serve`)")
    p.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                   help="a .gguf file or a Hugging Face model folder (default: the embedded SmolLM2-135M)")
    up.add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.model_path is not None:
        args.model = args.model_path
    return up.run(args)
