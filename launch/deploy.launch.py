"""Deployment: a trained policy through the robot env and the safety shield, on the simulated twin (started
here) or a real robot (`hardware:=panda`, whose ros2_control stack runs on its own), optionally recording
the session to a rosbag2 MCAP bag.

    ros2 launch launch/deploy.launch.py run:=runs/2026-11-23/10-00-00_panda_reach_sac
    ros2 launch launch/deploy.launch.py run:=<run dir> hardware:=panda record:=bags/session1
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PythonExpression

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robotrl_launch import robotrl_process


def generate_launch_description():
    run = LaunchConfiguration("run")
    hardware = LaunchConfiguration("hardware")
    episodes = LaunchConfiguration("episodes")
    record = LaunchConfiguration("record")
    on_twin = IfCondition(PythonExpression(["'", hardware, "' == 'sim_twin'"]))
    return LaunchDescription(
        [
            DeclareLaunchArgument("run", description="a robotrl-train run directory"),
            DeclareLaunchArgument("hardware", default_value="sim_twin", description="sim_twin | panda"),
            DeclareLaunchArgument("episodes", default_value="3"),
            DeclareLaunchArgument("record", default_value="null", description="a new bag directory, or null"),
            robotrl_process("robotrl-sim-twin", "sim_twin.yaml", name="sim_twin", condition=on_twin),
            robotrl_process(
                "robotrl-deploy",
                "deploy.yaml",
                ["run=", run],
                ["hardware=", hardware],
                ["episodes=", episodes],
                ["record=", record],
                name="deploy",
            ),
        ]
    )
