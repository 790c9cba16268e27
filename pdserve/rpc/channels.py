"""One grpc.aio channel per peer address, reused by every call to it, and one more for an event
feed (a stream that lasts the connection's life and that a reader must be able to fall behind)."""

from __future__ import annotations

import asyncio

import grpc

from pdserve.rpc.security import Security, metadata_injectors

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A peer that stops answering (stalled, SIGSTOPped, unplugged) fails every call on the
    # connection within keepalive time + timeout, instead of at the caller's deadline.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    # grpc-core 1.6x answers a stalled peer by its ping timeout, 60 s unless set, whatever the
    # keepalive timeout: a SIGSTOPped worker held its streams for 62 s.
    ("grpc.http2.ping_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect to a restarted worker within seconds; a connect that gets no answer gives up after 2 s.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 2000),
    ("grpc.max_reconnect_backoff_ms", 4000),
)

# An event feed's connection keeps a small receive window (pdserve/rpc/feed.py): gRPC otherwise
# grows it by its bandwidth probe until a reader that falls behind has thousands of a worker's
# step messages queued in the connection (seconds of them, and what comes after behind them),
# where a full window would make the worker's writes wait and its feed join each request's tokens.
FEED_OPTIONS = (
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 16 * 1024),
    # Its connection its own (not shared with another channel of the same arguments): a feed channel
    # left in its reconnect backoff is replaced by a fresh one, which must not inherit that backoff.
    ("grpc.use_local_subchannel_pool", 1),
)


class ChannelPool:
    def __init__(self, security: Security = Security()):
        self.credentials = security.channel_credentials()
        metadata = security.client_metadata()
        self.interceptors = metadata_injectors(metadata) if metadata else ()
        self.options = (*CHANNEL_OPTIONS, *security.channel_options())
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._feeds: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task] = set()  # replaced feed channels' closes, until done

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._open(address, self.options)
        return channel

    def feed(self, address: str) -> grpc.aio.Channel:
        """The peer's channel for event feeds: a connection of its own, its window kept small. One
        that failed to connect is replaced: no request's call keeps it trying (the calls' channel has
        the worker's polls), so after a worker's restart it would sit in its reconnect backoff, and
        every feed opened on it would fail at once while the worker serves again."""
        channel = self._feeds.get(address)
        if channel is not None and channel.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            closing = asyncio.ensure_future(channel.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            channel = None
        if channel is None:
            channel = self._feeds[address] = self._open(address, (*self.options, *FEED_OPTIONS))
        return channel

    def _open(self, address: str, options) -> grpc.aio.Channel:
        if self.credentials is not None:
            return grpc.aio.secure_channel(address, self.credentials, options, interceptors=self.interceptors)
        return grpc.aio.insecure_channel(address, options, interceptors=self.interceptors)

    async def drop(self, address: str) -> None:
        for channels in (self._channels, self._feeds):
            channel = channels.pop(address, None)
            if channel is not None:
                await channel.close()

    async def close(self) -> None:
        for address in {*self._channels, *self._feeds}:
            await self.drop(address)


def split_addresses(value: str) -> list[str]:
    """"host:port,host:port" (a flag's value) as a list; blanks dropped."""
    return [a.strip() for a in value.split(",") if a.strip()]
