"""Admission that predicts time to first token: what a prompt will wait for on each path
(ttft.py), the objectives per priority class (objectives.py), and what to do with a request no
path serves within its class's objective (policy.py). Policies over numbers: the router feeds them
its workers' polled figures and what it measured itself; the simulator can feed them its own."""

from pdserve.admission.objectives import Objective, Objectives, parse_objectives
from pdserve.admission.policy import Admission, AdmissionPolicy, Verdict
from pdserve.admission.ttft import PrefillSide, TtftPrediction, predict_prefill, predict_ttft

__all__ = ["Admission", "AdmissionPolicy", "Objective", "Objectives", "PrefillSide", "TtftPrediction",
           "Verdict", "parse_objectives", "predict_prefill", "predict_ttft"]
