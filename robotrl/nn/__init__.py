"""Network building blocks: MLPs, ensembles, observation encoders, action distributions."""

from robotrl.nn.distributions import TanhNormal
from robotrl.nn.encoders import StateEncoder
from robotrl.nn.mlp import EnsembleLinear, EnsembleMLP, mlp

__all__ = ["EnsembleLinear", "EnsembleMLP", "StateEncoder", "TanhNormal", "mlp"]
