"""The simulated twin: a MuJoCo robot that speaks ros2_control's topics, for running every deployment path
before the real robot.

    ros2 launch launch/sim_twin.launch.py rate_hz:=500 cameras:="[front]"
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robotrl_launch import robotrl_process


def generate_launch_description():
    robot = LaunchConfiguration("robot")
    rate_hz = LaunchConfiguration("rate_hz")
    cameras = LaunchConfiguration("cameras")
    return LaunchDescription(
        [
            DeclareLaunchArgument("robot", default_value="panda", description="a spec in robotrl/core/robots/"),
            DeclareLaunchArgument("rate_hz", default_value="500", description="control rate"),
            DeclareLaunchArgument("cameras", default_value="[]", description="cameras to publish, e.g. [front]"),
            robotrl_process(
                "robotrl-sim-twin",
                "sim_twin.yaml",
                ["robot=", robot],
                ["rate_hz=", rate_hz],
                ["cameras=", cameras],
                name="sim_twin",
            ),
        ]
    )
