"""The stream interval: when a request's held tokens go out to its client, as vLLM's and SGLang's
--stream-interval (the policy; router/doors/pacing.py holds and sends).

    off (default)   each token event as it comes (merged only while the client is behind:
                    pdserve/coalescing.py)
    N               a message once N tokens are held
    Tms             a message once T milliseconds passed since the request's last one

The first token goes at once (time to first token unchanged); the request's end (its finish,
a fault, an abort) sends whatever is held first.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

MAX_TOKENS = 1024
MAX_MS = 10_000.0


@dataclass(frozen=True)
class StreamInterval:
    tokens: int = 0  # a message once this many are held (0: not by count)
    seconds: float = 0.0  # a message once this long since the last (0: not by time)

    @property
    def off(self) -> bool:
        return self.tokens <= 1 and self.seconds <= 0

    @property
    def gather_tokens(self) -> int:
        """Tokens a request's relay may gather before its flow takes them (FlowConfig.gather_tokens):
        N, where nothing goes out sooner than N tokens after the first; 0 where time may send them."""
        return 0 if self.off or self.seconds > 0 else self.tokens

    def due(self, held: int, since_sent_s: float | None) -> bool:
        """Whether `held` tokens go out now; `since_sent_s`: since the request's last message
        (None: nothing sent yet, so this is its first token)."""
        if since_sent_s is None or self.off:
            return True
        return (self.tokens > 0 and held >= self.tokens) or (self.seconds > 0 and since_sent_s >= self.seconds)

    def __str__(self) -> str:
        if self.off:
            return "off"
        return f"{self.seconds * 1000:g}ms" if self.seconds else str(self.tokens)


def parse_stream_interval(text: str) -> StreamInterval:
    """'4' (tokens), '20ms' (milliseconds), 'off' or '0'; ValueError for anything else."""
    value = text.strip().lower()
    if value in ("off", "0", "0ms"):
        return StreamInterval()
    try:
        if value.endswith("ms"):
            ms = float(value[:-2])
            if not 0 < ms <= MAX_MS:
                raise ValueError
            return StreamInterval(seconds=ms / 1000)
        tokens = int(value)
        if not 0 < tokens <= MAX_TOKENS:
            raise ValueError
        return StreamInterval(tokens=tokens)
    except ValueError:
        raise ValueError(f"a stream interval is tokens (1 to {MAX_TOKENS}, as 4), milliseconds (up to "
                         f"{MAX_MS:g}, as 20ms) or off; got {text!r}") from None


def _flag_value(text: str) -> StreamInterval:
    try:
        return parse_stream_interval(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_stream_interval_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-interval", type=_flag_value, default=StreamInterval(), metavar="N|Tms|off",
                   help="router: a request's tokens to its client in one message per N tokens (4) or per T "
                        "milliseconds (20ms), the first at once, the last with the finish (default: off, each "
                        "as it comes)")


def stream_interval_argv(args: argparse.Namespace) -> list[str]:
    """What `pdserve up` passes on to its router."""
    return ["--stream-interval", str(args.stream_interval)]
