"""Compliant control: robotrl-deploy of an ee_delta policy (panda_peg_insert) sending equilibrium poses to a Cartesian
impedance controller (hardware.command=cartesian_pose, through the pose shield). `hardware:=sim_twin` starts the twin,
whose impedance controller listens on the same topic; on the robot the controller runs in its ros2_control stack
(a Cartesian impedance controller taking geometry_msgs/PoseStamped, as HIL-SERL's Franka runs).

    ros2 launch launch/impedance.launch.py run:=runs/<peg run>
    ros2 launch launch/impedance.launch.py run:=runs/<peg run> hardware:=panda
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
    on_twin = IfCondition(PythonExpression(["'", hardware, "' == 'sim_twin'"]))
    return LaunchDescription(
        [
            DeclareLaunchArgument("run", description="a robotrl-train run directory of an ee_delta policy"),
            DeclareLaunchArgument("hardware", default_value="sim_twin", description="sim_twin | panda"),
            DeclareLaunchArgument("episodes", default_value="3"),
            robotrl_process("robotrl-sim-twin", "impedance_twin.yaml", name="sim_twin", condition=on_twin),
            robotrl_process(
                "robotrl-deploy",
                "impedance_deploy.yaml",
                ["run=", run],
                ["hardware=", hardware],
                ["episodes=", episodes],
                name="deploy",
            ),
        ]
    )
