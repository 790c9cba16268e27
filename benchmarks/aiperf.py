"""NVIDIA's AIPerf (a third-party benchmark) against `pdserve up`'s OpenAI door, beside our own
`pdserve bench`.

AIPerf lives in a virtual environment of its own (.venv-aiperf, AIPERF_VERSION pinned), made on
first use. It counts tokens with a Hugging Face tokenizer: the served model's is written as one
(tokenizer.json from our GGUF tokenizer, identical ids: tests/tokenizer) into a temporary folder,
so nothing is downloaded. Runs, each printed as AIPerf prints it:

    chat      streaming chat, fixed input/output lengths (ignore_eos), --concurrency
    goodput   the same with TTFT and inter-token latency objectives (AIPerf's --goodput)
    cancel    the same with --cancel-rate percent of requests cancelled by the client
    turns     multi-turn conversations (2 turns each on average)

    make bench-aiperf                          # all four on the embedded model, concurrency 8
    .venv/bin/python benchmarks/aiperf.py --runs chat --concurrency 16 --requests 64
    .venv/bin/python benchmarks/aiperf.py --target http://HOST:8000 --model NAME --tokenizer DIR

Then `pdserve bench` runs its own chat load on the same fleet, for its table beside AIPerf's.

With the fleet it starts itself, every service exports its spans to an OTLP receiver here, and
after each run AIPerf's per-request TTFT and ITL are set beside the router's spans of the same
requests (matched by the X-Request-ID AIPerf sends: pdserve/bench/span_agreement.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pdserve.bench.span_agreement import agreement, aiperf_records, format_agreement  # noqa: E402
from pdserve.procs.up_process import UpProcess  # noqa: E402
from tests.helpers.otlp_receivers import GrpcReceiver  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AIPERF_VERSION = "0.13.0"
VENV = ROOT / ".venv-aiperf"


def aiperf() -> Path:
    """The pinned AIPerf's command, installed into its own virtual environment once."""
    exe = VENV / "bin" / "aiperf"
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True) if exe.exists() else None
    if version is None or AIPERF_VERSION not in version.stdout + version.stderr:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"aiperf=={AIPERF_VERSION}"], check=True)
    return exe


def tokenizer_folder(model: str | None, into: Path) -> Path:
    """The model's tokenizer as a Hugging Face tokenizer folder AIPerf can load offline."""
    from pdserve.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model)
    into.mkdir(parents=True, exist_ok=True)
    (into / "tokenizer.json").write_text(tokenizer.tokenizer_json())
    (into / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return into


RUNS = {
    "chat": [],
    "goodput": ["--goodput", "time_to_first_token:{ttft_ms} inter_token_latency:{itl_ms}"],
    "cancel": ["--request-cancellation-rate", "{cancel_rate}", "--request-cancellation-delay", "0.5"],
    "turns": ["--conversation-num", "{conversations}", "--conversation-turn-mean", "2",
              "--conversation-turn-stddev", "0"],
}


def profile(exe: Path, args: argparse.Namespace, url: str, model: str, tokenizer: Path, run: str, out: Path) -> int:
    extra = [a.format(**vars(args)) for a in RUNS[run]]
    count = [] if run == "turns" else ["--request-count", str(args.requests)]
    cmd = [str(exe), "profile", "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(tokenizer), "--concurrency", str(args.concurrency), *count,
           "--prompt-input-tokens-mean", str(args.input_tokens), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(args.output_tokens), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"max_completion_tokens:{args.output_tokens}",
           "--use-server-token-count",  # the usage each response reports, not a re-tokenisation of its text
           "--warmup-request-count", "2", "--random-seed", "0", "--ui-type", "none",
           "--output-artifact-dir", str(out / run), *extra]
    print(f"== aiperf {run}: {' '.join(cmd[1:])}", flush=True)
    # NOTE: not HF_HUB_OFFLINE: AIPerf 0.13 then looks a local tokenizer folder up in the hub's
    # cache and fails; without it a local folder is read as it is.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return subprocess.run(cmd, env=env).returncode


def up(args: argparse.Namespace, otlp: str) -> tuple[UpProcess, str, str]:
    """`pdserve up` serving the OpenAI door on a free port, its spans exported to `otlp`: (it, the
    door's URL, the served name)."""
    from pdserve.checkpoint.source import served_name

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n",
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    process = UpProcess(["--port", "0", "--http-port", "0", "--threads", "1", "--anonymous-max-priority", "vip"] +
                        (["--model", args.model] if args.model else []), env, ready_timeout_s=300)
    process.start()
    status = json.loads(process.status_file.read_text())
    return process, status["http"].removesuffix("/v1"), served_name(args.model)


def compare_spans(receiver, run: str, out: Path) -> None:
    """AIPerf's per-request latencies of `run` beside the router's spans of the same requests."""
    client = aiperf_records(out / run / "profile_export.jsonl")
    spans = []
    for _ in range(30):  # the batch span processors export every few seconds
        spans = [s.attributes for s in receiver.sink.spans if s.name == "pdserve.generate"]
        if {rid for rid in client} <= {a.get("gen_ai.request.id") for a in spans}:
            break
        time.sleep(0.5)
    print(format_agreement(run, agreement(client, spans)), flush=True)


def ours(target: str, args: argparse.Namespace) -> None:
    """`pdserve bench` on the same fleet: our own table beside AIPerf's."""
    cmd = [sys.executable, "-m", "pdserve.cli.main", "bench", "--target", target, "--workload", "chat",
           "--requests", str(args.requests), "--no-progress"]
    print(f"== pdserve bench: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="chat,goodput,cancel,turns")
    p.add_argument("--target", default=None, help="an OpenAI door already serving (default: start `pdserve up`)")
    p.add_argument("--model", default=None, help="the model (default: the embedded one)")
    p.add_argument("--served-model-name", default=None, help="with --target: the name it serves")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=2000.0)
    p.add_argument("--itl-ms", type=float, default=200.0)
    p.add_argument("--cancel-rate", type=float, default=10.0)
    args = p.parse_args()
    exe = aiperf()
    with tempfile.TemporaryDirectory(prefix="pdserve-aiperf-") as tmp:
        work = Path(tmp)
        tokenizer = tokenizer_folder(args.model, work / "tokenizer")
        process, receiver, failed = None, None, []
        if args.target:
            from pdserve.checkpoint.source import served_name

            url, model = args.target, args.served_model_name or served_name(args.model)
        else:
            receiver = GrpcReceiver()
            process, url, model = up(args, receiver.endpoint)
        try:
            for run in args.runs.split(","):
                if profile(exe, args, url, model, tokenizer, run, work):
                    failed.append(run)
                elif receiver is not None:
                    compare_spans(receiver, run, work)
            if process is not None:
                ours(process.router, args)
        finally:
            if process is not None:
                process.stop()
            if receiver is not None:
                receiver.stop()
    print(f"aiperf runs failed: {failed}" if failed else "aiperf: every run completed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
