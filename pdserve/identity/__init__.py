"""What a worker serves, as a compatibility identity: the model (weights, architecture, tokenizer)
and the KV it computes (dtype, block size, the worker protocol). Two workers may pair only when
their identities agree; the router serves only workers whose model is its own."""

from pdserve.identity.fingerprint import ModelFingerprint, model_fingerprint
from pdserve.identity.identity import PROTOCOL, WorkerIdentity

__all__ = ["PROTOCOL", "ModelFingerprint", "WorkerIdentity", "model_fingerprint"]
