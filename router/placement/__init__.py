"""Where an attempt runs: the placement policies, the placer that asks the workers, the decision
to prefill on the decode worker, admission by predicted time to first token, and rebalancing."""
