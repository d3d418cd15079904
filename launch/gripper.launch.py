"""A gripper policy on the robot (or the twin): robotrl-deploy of a panda_pick_cube run with its cube tracked, the
Franka Hand driven through franka_gripper's Move and Grasp actions (hardware.gripper_interface=franka_action; the
robot side runs rmw_cyclonedds_cpp, docs/hardware.md). `hardware:=sim_twin` starts the twin serving the same
actions; on the robot, franka_gripper's node is started here.

    ros2 launch launch/gripper.launch.py run:=runs/<pick run>
    ros2 launch launch/gripper.launch.py run:=runs/<pick run> hardware:=panda
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robotrl_launch import robotrl_process

PARAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "params")


def generate_launch_description():
    run = LaunchConfiguration("run")
    hardware = LaunchConfiguration("hardware")
    episodes = LaunchConfiguration("episodes")
    on_twin = PythonExpression(["'", hardware, "' == 'sim_twin'"])
    return LaunchDescription(
        [
            DeclareLaunchArgument("run", description="a robotrl-train run directory of panda_pick_cube"),
            DeclareLaunchArgument("hardware", default_value="sim_twin", description="sim_twin | panda"),
            DeclareLaunchArgument("episodes", default_value="3"),
            robotrl_process("robotrl-sim-twin", "gripper_twin.yaml", name="sim_twin", condition=IfCondition(on_twin)),
            Node(
                package="franka_gripper",
                executable="franka_gripper_node",
                name="franka_gripper",
                parameters=[os.path.join(PARAMS, "franka_gripper.yaml")],
                condition=UnlessCondition(on_twin),
            ),
            robotrl_process(
                "robotrl-deploy",
                "gripper_deploy.yaml",
                ["run=", run],
                ["hardware=", hardware],
                ["episodes=", episodes],
                name="deploy",
            ),
        ]
    )
