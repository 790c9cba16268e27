"""Size limits of the public API, checked before any work (tokenising, copying, templating).

The gateway checks a request's sizes once (`check`), as its door read them off the wire (an
AskSizes: the length of a repeated field costs nothing, copying it does), before the request is
converted; the frontend checks the prompt's characters as it reads them. Every refusal is an
InvalidRequestError naming the limit and its flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.errors import InvalidRequestError
from router.doors.asks import AskSizes

ROLES = ("system", "user", "assistant", "tool")  # tool: a function's result (OpenAI's tool messages)


@dataclass(frozen=True)
class InputLimits:
    max_prompt_chars: int = 2 << 20  # a text prompt, or all chat contents together
    max_prompt_tokens: int = 131072  # a token-id prompt (the model's context applies as well)
    max_messages: int = 512
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # each stop string
    max_stop_token_ids: int = 64
    max_request_id_chars: int = 128

    def check(self, sizes: AskSizes) -> None:
        """Every limit a request's sizes meet before anything of it is copied or tokenised."""
        if sizes.request_id:
            self.check_request_id(sizes.request_id)
        self.check_stops(sizes.stops, sizes.stop_token_ids)
        if sizes.token_ids is not None:
            self.check_token_ids(sizes.token_ids)
        if sizes.messages is not None:
            self.check_messages(sizes.messages)
        if sizes.prior_token_ids:
            self.check_token_ids(sizes.prior_token_ids)

    def check_request_id(self, request_id: str) -> None:
        if len(request_id) > self.max_request_id_chars:
            raise InvalidRequestError(f"request_id has {len(request_id)} characters; at most "
                                      f"{self.max_request_id_chars} (--max-request-id-chars)")
        if not (request_id.isascii() and request_id.isprintable()):
            raise InvalidRequestError("request_id must be printable ASCII")

    def check_text(self, num_chars: int) -> None:
        if num_chars > self.max_prompt_chars:
            raise InvalidRequestError(f"the prompt has {num_chars} characters; at most {self.max_prompt_chars} "
                                      "(--max-prompt-chars)")

    def check_token_ids(self, count: int) -> None:
        if count > self.max_prompt_tokens:
            raise InvalidRequestError(f"the prompt has {count} token ids; at most {self.max_prompt_tokens} "
                                      "(--max-prompt-tokens)")

    def check_messages(self, count: int) -> None:
        if count > self.max_messages:
            raise InvalidRequestError(f"the chat has {count} messages; at most {self.max_messages} (--max-messages)")

    def check_chat(self, roles: Sequence[str], content_chars: int) -> None:
        """After check_messages: every role known, all contents within the prompt limit."""
        for i, role in enumerate(roles):
            if role not in ROLES:
                raise InvalidRequestError(f"chat message {i} has role {role[:32]!r}; use one of {', '.join(ROLES)}")
        self.check_text(content_chars)

    def check_stops(self, stops: Sequence[str], num_stop_token_ids: int) -> None:
        if len(stops) > self.max_stop_strings:
            raise InvalidRequestError(f"{len(stops)} stop strings; at most {self.max_stop_strings} (--max-stop-strings)")
        if any(len(s) > self.max_stop_chars for s in stops):
            raise InvalidRequestError(f"a stop string is longer than {self.max_stop_chars} characters "
                                      "(--max-stop-chars)")
        if num_stop_token_ids > self.max_stop_token_ids:
            raise InvalidRequestError(f"{num_stop_token_ids} stop token ids; at most {self.max_stop_token_ids} "
                                      "(--max-stop-token-ids)")


def add_limit_flags(p) -> None:
    """The router's flags for these limits (argparse)."""
    d = InputLimits()
    g = p.add_argument_group("input limits (checked before any work)")
    g.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars,
                   help="characters of a text prompt, or of all chat contents together")
    g.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="ids of a token-id prompt")
    g.add_argument("--max-messages", type=int, default=d.max_messages, help="messages of a chat")
    g.add_argument("--max-stop-strings", type=int, default=d.max_stop_strings)
    g.add_argument("--max-stop-chars", type=int, default=d.max_stop_chars, help="characters of each stop string")
    g.add_argument("--max-stop-token-ids", type=int, default=d.max_stop_token_ids)
    g.add_argument("--max-request-id-chars", type=int, default=d.max_request_id_chars)


def limits_from_args(args) -> InputLimits:
    return InputLimits(args.max_prompt_chars, args.max_prompt_tokens, args.max_messages, args.max_stop_strings,
                       args.max_stop_chars, args.max_stop_token_ids, args.max_request_id_chars)
