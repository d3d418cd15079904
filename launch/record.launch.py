"""Recording demonstrations on the robot (or the twin): robotrl-record through the robot env and the shield, a
person driving with a pad through joy_node (or a SpaceMouse through spacenav_node); pick's Start button marks a
success. `hardware:=sim_twin` starts the twin with pick's scene and its cube tracked.

    ros2 launch launch/record.launch.py                                   # the twin, a pad, pick, 20 episodes
    ros2 launch launch/record.launch.py hardware:=panda teleop:=twist out:=datasets/pick_robot
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robotrl_launch import robotrl_process

PARAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "params")


def generate_launch_description():
    task = LaunchConfiguration("task")
    hardware = LaunchConfiguration("hardware")
    teleop = LaunchConfiguration("teleop")
    episodes = LaunchConfiguration("episodes")
    out = LaunchConfiguration("out")
    on_twin = IfCondition(PythonExpression(["'", hardware, "' == 'sim_twin'"]))
    return LaunchDescription(
        [
            DeclareLaunchArgument("task", default_value="panda_pick_cube"),
            DeclareLaunchArgument("hardware", default_value="sim_twin", description="sim_twin | panda"),
            DeclareLaunchArgument("teleop", default_value="joy", description="joy | twist | keyboard | scripted"),
            DeclareLaunchArgument("episodes", default_value="20"),
            DeclareLaunchArgument("out", default_value="datasets/robot_demos", description="the dataset directory"),
            robotrl_process("robotrl-sim-twin", "record_twin.yaml", name="sim_twin", condition=on_twin),
            Node(
                package="joy",
                executable="joy_node",
                name="joy_node",
                parameters=[os.path.join(PARAMS, "joy.yaml")],
                condition=IfCondition(PythonExpression(["'", teleop, "' == 'joy'"])),
            ),
            Node(
                package="spacenav",
                executable="spacenav_node",
                name="spacenav",
                parameters=[os.path.join(PARAMS, "spacenav.yaml")],
                condition=IfCondition(PythonExpression(["'", teleop, "' == 'twist'"])),
            ),
            robotrl_process(
                "robotrl-record",
                "record.yaml",
                ["task=", task],
                ["hardware=", hardware],
                ["teleop=", teleop],
                ["episodes=", episodes],
                ["out=", out],
                name="record",
            ),
        ]
    )
