"""A hand policy on a 16-joint hand (or its twin): robotrl-deploy of a hand_reorient run through the robot env and the
shield over the hand's 16 joints, its cube tracked, the goal orientation given. `hardware:=hand_twin` starts the twin
with the hand's scene; on a real hand (an Allegro or LEAP hand under ros2_control) its driver and the cube's tracker
run on their own, and `hardware:=` names a config like configs/hardware/hand_twin.yaml for it.

    ros2 launch launch/hand.launch.py run:=runs/<hand run>
    ros2 launch launch/hand.launch.py run:=runs/<hand run> goal_quat:="[0.7071068,0,0,0.7071068]"
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
    goal_quat = LaunchConfiguration("goal_quat")
    on_twin = IfCondition(PythonExpression(["'", hardware, "' == 'hand_twin'"]))
    return LaunchDescription(
        [
            DeclareLaunchArgument("run", description="a robotrl-train run directory of hand_reorient"),
            DeclareLaunchArgument("hardware", default_value="hand_twin", description="a config in configs/hardware"),
            DeclareLaunchArgument("episodes", default_value="3"),
            DeclareLaunchArgument("goal_quat", default_value="[0.7071068,0,0,0.7071068]", description="w,x,y,z"),
            robotrl_process("robotrl-sim-twin", "hand_twin.yaml", name="sim_twin", condition=on_twin),
            robotrl_process(
                "robotrl-deploy",
                "hand_deploy.yaml",
                ["run=", run],
                ["hardware=", hardware],
                ["episodes=", episodes],
                ["+goal.goal_quat=", goal_quat],
                name="deploy",
            ),
        ]
    )
