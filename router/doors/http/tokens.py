"""The tokenizer through the HTTP door, as vLLM's server offers it, and the server's version:

    POST /tokenize     {"prompt": "text"} or {"messages": [...], "add_generation_prompt": true}
                       -> {"count", "max_model_len", "tokens"}   (the same ids a request would get)
    POST /detokenize   {"tokens": [ids]} -> {"prompt": "text"}
    GET  /version      {"version": "0.1.0"}

`model`, when given, must name the served model (404 otherwise), as on the completion routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from pdserve.errors import InvalidRequestError
from router.doors.frontend import Frontend
from router.doors.http.errors import ModelNotFound
from router.doors.http.openai_requests import chat_messages


class TokenRoutes:
    def __init__(self, frontend: Frontend, model: str, max_model_len: int):
        self.frontend = frontend
        self.model = model
        self.max_model_len = max_model_len

    async def tokenize(self, body: Mapping) -> dict:
        self._check_model(body)
        if "messages" in body:
            if body.get("add_generation_prompt", True) is not True:
                raise InvalidRequestError("add_generation_prompt: only true is supported (the prompt a chat request gets)")
            tokens = await self.frontend.chat(chat_messages(body["messages"]))
        elif isinstance(body.get("prompt"), str):
            tokens = await self.frontend.text(body["prompt"])
        else:
            raise InvalidRequestError("give `prompt` (a string) or `messages` (a chat)")
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens}

    def detokenize(self, body: Mapping) -> dict:
        self._check_model(body)
        tokens = body.get("tokens")
        vocabulary = self.frontend.tokenizer.vocab_size
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequestError("`tokens` must be a list of token ids (integers)")
        if any(not 0 <= t < vocabulary for t in tokens):
            raise InvalidRequestError(f"a token id is outside the vocabulary (0..{vocabulary - 1})")
        return {"prompt": self.frontend.tokenizer.decode(tokens, skip_special_tokens=False)}

    def _check_model(self, body: Mapping) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise ModelNotFound(f"the model {str(model)[:64]!r} does not exist; this server serves {self.model!r}")


def server_version() -> dict:
    try:
        return {"version": version("pdserve")}
    except PackageNotFoundError:
        return {"version": "unknown"}
