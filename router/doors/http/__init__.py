"""The router's OpenAI-compatible HTTP door (aiohttp): the same gateway, flow, validation,
traces and metrics as the gRPC door."""
