"""The ways in: the public doors (gRPC in servicer.py, OpenAI HTTP in http/), the gateway both
share, and what it checks and answers on the way: who calls (tenants), sizes (limits), prompts
to tokens (frontend), Aborts (tombstones, aborting), and the pace tokens go out at."""
