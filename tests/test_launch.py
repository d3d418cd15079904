"""The ROS 2 launch files in launch/ cannot run here (no launch/launch_ros), so this reads them: every
robotrl process they start names an executable this package installs, and its parameter file (plus the
overrides built from launch arguments, at their defaults) composes against that program's Hydra config,
so an unknown key or a wrong type fails here rather than on the lab machine. External ROS nodes must
come from the drivers listed below, with a parameter file in ROS's own format."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
sys.path.insert(0, str(LAUNCH))
from robotrl_launch import hydra_overrides  # noqa: E402

# the console scripts the installed package provides: name -> "module:function"
SCRIPTS = {
    ep.name: ep.value for ep in importlib.metadata.distribution("robotrl").entry_points if ep.group == "console_scripts"
}
# ROS 2 drivers a session may start beside robotrl (installed with apt on the lab machine)
EXTERNAL_DRIVERS = {
    "usb_cam": {"usb_cam_node_exe"},
    "realsense2_camera": {"realsense2_camera_node"},
    "joy": {"joy_node"},
    "spacenav": {"spacenav_node"},
    "franka_gripper": {"franka_gripper_node"},
}
LAUNCH_FILES = sorted(LAUNCH.glob("*.launch.py"))


def _call_name(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def _keyword(node: ast.Call, name: str):
    return next((k.value for k in node.keywords if k.arg == name), None)


class LaunchFile:
    """What a launch file declares and starts, read from its syntax tree."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(), filename=str(path))
        calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        self.arguments = {  # DeclareLaunchArgument name -> default
            c.args[0].value: getattr(_keyword(c, "default_value"), "value", None)
            for c in calls
            if _call_name(c) == "DeclareLaunchArgument"
        }
        self.variables = {  # x = LaunchConfiguration("name")
            a.targets[0].id: a.value.args[0].value
            for a in ast.walk(self.tree)
            if isinstance(a, ast.Assign)
            and isinstance(a.value, ast.Call)
            and _call_name(a.value) == "LaunchConfiguration"
            and isinstance(a.targets[0], ast.Name)
        }
        self.processes = [c for c in calls if _call_name(c) == "robotrl_process"]
        self.nodes = [c for c in calls if _call_name(c) == "Node"]

    def launch_argument(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name) and node.id in self.variables:
            name = self.variables[node.id]
        elif isinstance(node, ast.Call) and _call_name(node) == "LaunchConfiguration":
            name = node.args[0].value
        else:
            raise AssertionError(
                f"{self.path.name}:{node.lineno}: an override part is neither text nor a launch argument"
            )
        assert name in self.arguments, f"{self.path.name}: LaunchConfiguration({name!r}) is never declared"
        default = self.arguments[name]
        return f"required-{name}" if default is None else str(default)  # a required argument: any text

    def override(self, node: ast.AST) -> str:
        """An override as the process would get it with every launch argument at its default."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return "".join(self.override(part) for part in node.elts)
        return self.launch_argument(node)


def _config_name(executable: str) -> str:
    """The config_name of the @hydra.main that the console script `executable` runs."""
    module_name = SCRIPTS[executable].split(":")[0]
    source = Path(importlib.util.find_spec(module_name).origin).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "main" and _keyword(node, "config_name"):
            return _keyword(node, "config_name").value
    raise AssertionError(f"{module_name} has no @hydra.main(config_name=...)")


def test_there_are_launch_files_for_deployment_the_twin_fine_tuning_recording_grippers_impedance_and_hands():
    names = {p.name for p in LAUNCH_FILES}
    expected = {"deploy.launch.py", "finetune.launch.py", "sim_twin.launch.py", "record.launch.py"}
    assert expected | {"gripper.launch.py", "impedance.launch.py", "hand.launch.py"} <= names, names


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_defines_a_launch_description(path):
    launch = LaunchFile(path)
    functions = {n.name for n in launch.tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    assert launch.processes or launch.nodes, f"{path.name} starts nothing"


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_every_robotrl_process_is_an_installed_program_and_its_parameters_compose(path):
    launch = LaunchFile(path)
    for call in launch.processes:
        executable, params = call.args[0].value, call.args[1].value
        assert executable in SCRIPTS, f"{path.name}: {executable!r} is not a console script that robotrl installs"
        overrides = hydra_overrides(params) + [launch.override(arg) for arg in call.args[2:]]
        module = importlib.import_module(SCRIPTS[executable].split(":")[0])  # registers the config schema ...
        if hasattr(module, "register_config"):  # ... or has it registered by main, lazily
            module.register_config()
        with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
            cfg = compose(config_name=_config_name(executable), overrides=overrides)
        typed = getattr(module, f"to_{_config_name(executable)}_config", None)  # the program's own conversion
        config = typed(cfg) if typed is not None else OmegaConf.to_object(cfg)
        if hasattr(config, "validate"):
            config.validate()
        assert module is not None


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_external_nodes_are_known_drivers_with_ros_parameter_files(path):
    launch = LaunchFile(path)
    for call in launch.nodes:
        package, executable = _keyword(call, "package").value, _keyword(call, "executable").value
        assert executable in EXTERNAL_DRIVERS.get(package, ()), f"{path.name}: unknown node {package}/{executable}"
        params = _keyword(call, "parameters")
        for entry in getattr(params, "elts", []):
            file = next(a.value for a in ast.walk(entry) if isinstance(a, ast.Constant) and a.value.endswith(".yaml"))
            data = OmegaConf.to_container(OmegaConf.load(LAUNCH / "params" / file))
            node_name = _keyword(call, "name").value
            assert "ros__parameters" in data.get(node_name, {}), f"{file}: not a ROS parameter file for {node_name}"


def test_parameter_files_become_hydra_overrides(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text("task: panda_reach\nhil: {operator: keyboard, teleop_gain: 0.5}\nflag: true\nlist: [1, 2]\n")
    assert hydra_overrides(params) == [
        "task=panda_reach",
        "hil.operator=keyboard",
        "hil.teleop_gain=0.5",
        "flag=true",
        "list=[1,2]",
    ]
    params.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping of config keys"):
        hydra_overrides(params)


def test_a_key_the_program_does_not_accept_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: panda_reach\nactor_idd: x\n")
    importlib.import_module("robotrl.actor")
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        with pytest.raises(Exception, match="actor_idd"):
            compose(config_name="actor", overrides=hydra_overrides(bad))
