"""Network building blocks: MLPs, ensembles, observation encoders and their running normalizer, action
distributions (tanh-normal, gSDE)."""

from robotrl.nn.distributions import TanhNormal
from robotrl.nn.encoders import StateEncoder
from robotrl.nn.gsde import GSDE, GSDENoise
from robotrl.nn.mlp import EnsembleLinear, EnsembleMLP, mlp
from robotrl.nn.normalizer import RunningNormalizer

__all__ = [
    "GSDE",
    "EnsembleLinear",
    "EnsembleMLP",
    "GSDENoise",
    "RunningNormalizer",
    "StateEncoder",
    "TanhNormal",
    "mlp",
]
