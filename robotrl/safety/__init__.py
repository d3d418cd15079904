"""The safety shield between a policy (or an operator) and the robot's joint-position command input."""

from robotrl.safety.config import ShieldConfig, ShieldConfigError
from robotrl.safety.corrections import CORRECTION_KINDS
from robotrl.safety.kinematics import KinematicChain, MJCFError
from robotrl.safety.pose_shield import PoseLimits, PoseShield, SafePose
from robotrl.safety.shield import EStopLatchedError, SafeCommand, Shield, ShieldResetError
from robotrl.safety.workspace import WorkspaceBox

__all__ = [
    "CORRECTION_KINDS",
    "EStopLatchedError",
    "KinematicChain",
    "MJCFError",
    "PoseLimits",
    "PoseShield",
    "SafeCommand",
    "SafePose",
    "Shield",
    "ShieldConfig",
    "ShieldConfigError",
    "ShieldResetError",
    "WorkspaceBox",
]
