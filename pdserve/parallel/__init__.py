"""Tensor parallelism inside one worker: the model split across ranks (one process each) as a
transform (`shard.py`, `layers.py`), the collectives behind an interface (`communicator.py`), and
the ranks run as one unit (`leader.py` starts and drives the followers, `follower.py`)."""
