"""--stream-interval: the router's flag (off by default, a bad value refused at parse, saying what
it takes), and `pdserve up` / `pdserve serve` passing theirs on to the router they start."""

from __future__ import annotations

import pytest

from pdserve.cli import main, up
from router.doors.stream_interval import StreamInterval

pytestmark = pytest.mark.timeout(60)


def _parse(argv: list[str]):
    return main.build_parser().parse_args(argv)


def test_the_router_streams_each_token_as_it_comes_unless_told():
    assert _parse(["router"]).stream_interval == StreamInterval()
    assert _parse(["router", "--stream-interval", "4"]).stream_interval == StreamInterval(tokens=4)
    assert _parse(["router", "--stream-interval", "20ms"]).stream_interval == StreamInterval(seconds=0.02)


@pytest.mark.parametrize("value", ["-4", "4 tokens", "20s"])
def test_a_bad_interval_is_refused_at_parse(value, capsys):
    with pytest.raises(SystemExit):
        _parse(["router", "--stream-interval", value])
    assert "--stream-interval" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["up"], ["serve", "/models/x.gguf"]])
@pytest.mark.parametrize("value", ["4", "20ms", "off"])
def test_up_and_serve_pass_the_interval_on_to_their_router(command, value):
    args = _parse([*command, "--stream-interval", value])
    argv = up.router_argv(args, {"prefill": ["127.0.0.1:1"], "decode": ["127.0.0.1:2"]})
    assert _parse(argv).stream_interval == _parse(["router", "--stream-interval", value]).stream_interval
