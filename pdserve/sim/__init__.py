"""Physics of serving: hardware profiles, model shapes, a roofline step cost model and bounds.

Tensor-free and import-light, so a discrete-event simulator can price millions of steps.
"""

from pdserve.sim.costmodel import StepCost, StepCostModel, StepLoad
from pdserve.sim.hardware import HardwareProfile, Link, get_hardware, hardware_profiles
from pdserve.sim.shapes import ModelShape, attended_positions, get_shape, model_shapes

__all__ = [
    "HardwareProfile",
    "Link",
    "ModelShape",
    "StepCost",
    "StepCostModel",
    "StepLoad",
    "attended_positions",
    "get_hardware",
    "get_shape",
    "hardware_profiles",
    "model_shapes",
]
