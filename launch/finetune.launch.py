"""A fine-tuning session on the robot PC: the actor (policy on the robot through the shield, operator
takeover, learned reward) and camera drivers; the learner runs on the GPU box (`with_learner:=true` starts
one here instead). `hardware:=sim_twin` rehearses it against the simulated twin (started separately).

    ros2 launch launch/finetune.launch.py learner:=gpu-box:50051 operator:=spacemouse hardware:=panda
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robotrl_launch import robotrl_process


def generate_launch_description():
    learner = LaunchConfiguration("learner")
    operator = LaunchConfiguration("operator")
    hardware = LaunchConfiguration("hardware")
    return LaunchDescription(
        [
            DeclareLaunchArgument("learner", default_value="127.0.0.1:50051", description="the learner's host:port"),
            DeclareLaunchArgument("operator", default_value="spacemouse", description="keyboard|spacemouse|gamepad"),
            DeclareLaunchArgument("hardware", default_value="panda", description="panda | sim_twin"),
            DeclareLaunchArgument("with_learner", default_value="false", description="run the learner here too"),
            DeclareLaunchArgument("cameras", default_value="true", description="start the camera drivers"),
            robotrl_process(
                "robotrl-learner",
                "finetune_learner.yaml",
                name="learner",
                condition=IfCondition(LaunchConfiguration("with_learner")),
            ),
            robotrl_process(
                "robotrl-actor",
                "finetune_actor.yaml",
                ["learner.address=", learner],
                ["hil.operator=", operator],
                ["hardware=", hardware],
                name="actor",
            ),
            Node(
                package="usb_cam",
                executable="usb_cam_node_exe",
                name="front_camera",
                namespace="camera/front",
                parameters=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "params", "front_camera.yaml")],
                condition=IfCondition(LaunchConfiguration("cameras")),
            ),
        ]
    )
