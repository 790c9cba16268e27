"""A request's flow through the workers: the protocol's state machine, the flow that drives one
request's attempts through its phases, what a fault leads to, departures, samples of one prompt,
and streams continued from another router."""
