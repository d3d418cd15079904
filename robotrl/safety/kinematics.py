"""Forward kinematics in torch for one site of an MJCF model, read with xml.etree (no simulator import).

Only the chain from the world to the site is read: body and frame placements (pos with quat, axisangle,
euler, xyaxes or zaxis), hinge and slide joints (axis, pos, ref), default classes and <include>. The pose
follows MuJoCo's mj_kinematics: a hinge rotates its body about the axis through its anchor.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class MJCFError(ValueError):
    """The MJCF could not be read into a kinematic chain; the message names the file and element."""


@dataclass(frozen=True)
class _Joint:
    name: str
    kind: str  # hinge | slide
    axis: tuple[float, float, float]
    anchor: tuple[float, float, float]
    ref: float


class KinematicChain:
    """Site pose of a serial chain as a function of its joint positions, batched over leading dimensions.

    `forward(q)` takes q [..., n] in the order of `joint_names` (the robot spec's) and returns the site's
    position [..., 3] and rotation matrix [..., 3, 3] in the model's world frame, in float64.
    """

    def __init__(
        self,
        joint_names: Sequence[str],
        fixed: torch.Tensor,
        axes: torch.Tensor,
        anchors: torch.Tensor,
        refs: torch.Tensor,
        slide: torch.Tensor,
        site: torch.Tensor,
    ):
        self.joint_names = tuple(joint_names)
        # fixed[j]: the 4x4 placement between joint j-1's frame and joint j's body; site: after the last joint
        self._fixed = fixed.double()
        axes = axes.double()
        self._axes = axes
        self._anchors = anchors.double()
        self._refs = refs.double()
        self._slide = slide
        self._has_slide = bool(slide.any())
        self._slide_axes = axes * slide[:, None]
        self._site = site.double()
        self._cross = torch.zeros(len(axes), 3, 3, dtype=torch.float64)  # [a]_x, for Rodrigues
        self._cross[:, 0, 1], self._cross[:, 0, 2] = -axes[:, 2], axes[:, 1]
        self._cross[:, 1, 0], self._cross[:, 1, 2] = axes[:, 2], -axes[:, 0]
        self._cross[:, 2, 0], self._cross[:, 2, 1] = -axes[:, 1], axes[:, 0]
        self._outer = axes[:, :, None] * axes[:, None, :]
        self._eye_minus_outer = torch.eye(3, dtype=torch.float64) - self._outer
        self._numpy_chain = self._point_chain()
        self._refs_numpy = self._refs.numpy()
        self._slide_numpy = self._slide.numpy()
        self._site_origin = np.append(self._site[:3, 3].numpy(), 1.0)  # homogeneous

    def _point_chain(self) -> list[np.ndarray]:
        """Per joint (innermost first), one [4, 12] matrix B that carries a homogeneous row point x through
        `fixed[j] @ joint_j(angle)`: with m = x B as three [4] blocks, x' = m0 + w1 m1 + w2 m2, where
        (w1, w2) = (cos, sin) of the angle for a hinge (Rodrigues about the axis through the anchor, folded
        with the fixed placement) and (angle, 0) for a slide. numpy float64."""
        steps = []
        for j in range(len(self.joint_names)):
            rotation_t = self._fixed[j, :3, :3].T.numpy()
            translation = self._fixed[j, :3, 3].numpy()
            anchor = self._anchors[j].numpy()
            matrix = np.zeros((4, 12))
            matrix[3, 3] = 1.0
            if bool(self._slide[j]):  # x' = (x + axis angle) F^T + t
                matrix[:3, :3], matrix[3, :3] = rotation_t, translation
                matrix[3, 4:7] = self._axes[j].numpy() @ rotation_t
            else:  # x' = (x - a) R^T F^T + a F^T + t, R^T = outer^T + cos (I - outer)^T + sin [axis]x^T
                for block, part in enumerate((self._outer[j], self._eye_minus_outer[j], self._cross[j])):
                    rotated = part.T.numpy() @ rotation_t
                    matrix[:3, 4 * block : 4 * block + 3] = rotated
                    matrix[3, 4 * block : 4 * block + 3] = -anchor @ rotated
                matrix[3, :3] += anchor @ rotation_t + translation
            steps.append(matrix)
        return steps[::-1]

    @classmethod
    def from_mjcf(cls, path: str | Path, site: str, joint_names: Sequence[str]) -> KinematicChain:
        return _ChainReader(Path(path)).read(site, joint_names)

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.as_tensor(q, dtype=torch.float64)
        if q.shape[-1] != len(self.joint_names):
            raise ValueError(f"expected {len(self.joint_names)} joint positions, got shape {tuple(q.shape)}")
        links = self._fixed @ self._joint_transforms(q - self._refs)  # [..., n, 4, 4], one matmul for all
        pose = links[..., 0, :, :]
        for j in range(1, len(self.joint_names)):
            pose = pose @ links[..., j, :, :]
        pose = pose @ self._site
        return pose[..., :3, 3], pose[..., :3, :3]

    def position(self, q: torch.Tensor) -> torch.Tensor:
        return self.forward(q)[0]

    def site_positions(self, q: np.ndarray) -> np.ndarray:
        """The site's position [N, 3] for joint positions q [N, n] (numpy float64): the same as `position`,
        but a point carried back through the chain (no 4x4 products), several times faster for the shield's
        per-step workspace checks."""
        q = np.asarray(q, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != len(self.joint_names):
            raise ValueError(f"expected joint positions [N, {len(self.joint_names)}], got shape {q.shape}")
        angle = q - self._refs_numpy
        slide = self._slide_numpy
        weights = np.stack(  # [N, n, 1, 3]: the blocks' weights per joint
            [np.ones_like(angle), np.where(slide, angle, np.cos(angle)), np.where(slide, 0.0, np.sin(angle))], axis=-1
        )[:, :, None, :]
        x = np.broadcast_to(self._site_origin, (len(q), 4))
        last = len(self.joint_names) - 1
        for index, matrix in enumerate(self._numpy_chain):
            x = (weights[:, last - index] @ (x @ matrix).reshape(len(q), 3, 4))[:, 0]
        return x[:, :3]

    def _joint_transforms(self, angle: torch.Tensor) -> torch.Tensor:
        hinge_angle = angle.masked_fill(self._slide, 0.0) if self._has_slide else angle
        cos, sin = torch.cos(hinge_angle)[..., None, None], torch.sin(hinge_angle)[..., None, None]
        transform = torch.zeros(*angle.shape, 4, 4, dtype=torch.float64)
        rotation = transform[..., :3, :3]
        # Rodrigues, written in place: cos I + sin [a]x + (1 - cos) a a^T
        rotation.copy_(self._outer + cos * self._eye_minus_outer + sin * self._cross)
        # a hinge about an axis through `anchor`: x -> R (x - anchor) + anchor; a slide moves along its axis
        translation = self._anchors - (rotation @ self._anchors[..., None])[..., 0]
        if self._has_slide:
            translation = translation + self._slide_axes * angle[..., None]
        transform[..., :3, 3] = translation
        transform[..., 3, 3] = 1.0
        return transform


class _ChainReader:
    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            raise MJCFError(f"MJCF file {path} does not exist")
        self.root = self._load(path, seen=())
        compiler = self.root.find("compiler")
        self.degrees = compiler is None or compiler.get("angle", "degree") == "degree"
        self.eulerseq = "xyz" if compiler is None else compiler.get("eulerseq", "xyz")
        self.defaults = {}  # class name -> (parent class name, {tag: attributes})
        for default in self.root.findall("default"):
            self._read_defaults(default, parent=None)

    def _load(self, path: Path, seen: tuple[Path, ...]) -> ET.Element:
        if path in seen:
            raise MJCFError(f"{path}: recursive <include>")
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as error:
            raise MJCFError(f"{path}: {error}") from error
        self._expand_includes(root, path, (*seen, path))
        return root

    def _expand_includes(self, element: ET.Element, path: Path, seen: tuple[Path, ...]) -> None:
        for index, child in reversed(list(enumerate(element))):
            if child.tag == "include":
                included = self._load(path.parent / child.get("file", ""), seen)
                element.remove(child)
                for offset, grandchild in enumerate(list(included)):
                    element.insert(index + offset, grandchild)
            else:
                self._expand_includes(child, path, seen)

    def _read_defaults(self, default: ET.Element, parent: str | None) -> None:
        name = default.get("class", "main")
        self.defaults[name] = (parent, {child.tag: child.attrib for child in default if child.tag != "default"})
        for child in default.findall("default"):
            self._read_defaults(child, parent=name)

    def _attribute(self, element: ET.Element, key: str, class_name: str) -> str | None:
        if key in element.attrib:
            return element.get(key)
        name: str | None = element.get("class", class_name)
        while name is not None:
            parent, tags = self.defaults.get(name, (None, {}))
            if key in tags.get(element.tag, {}):
                return tags[element.tag][key]
            name = parent
        return None

    def read(self, site_name: str, joint_names: Sequence[str]) -> KinematicChain:
        parents = {child: parent for parent in self.root.iter() for child in parent}
        sites = [s for s in self.root.iter("site") if s.get("name") == site_name]
        if len(sites) != 1:
            raise MJCFError(f"{self.path}: expected one site named {site_name!r}, found {len(sites)}")
        path = [sites[0]]
        while path[-1] in parents and path[-1].tag != "worldbody":
            path.append(parents[path[-1]])
        if path[-1].tag != "worldbody":
            raise MJCFError(f"{self.path}: site {site_name!r} is not inside <worldbody>")
        path.reverse()  # worldbody, body, ..., site

        fixed = torch.eye(4, dtype=torch.float64)
        segments: list[torch.Tensor] = []
        joints: list[_Joint] = []
        class_name = "main"
        for element in path[1:]:
            if element.tag not in ("body", "frame", "site"):
                raise MJCFError(f"{self.path}: unexpected <{element.tag}> on the path to site {site_name!r}")
            fixed = fixed @ self._placement(element, class_name)
            if element.tag == "site":
                break
            class_name = element.get("childclass", class_name)
            if element.tag == "frame":
                continue
            for joint_element in element.findall("joint"):
                segments.append(fixed)
                fixed = torch.eye(4, dtype=torch.float64)
                joints.append(self._joint(joint_element, class_name))
            for free in element.findall("freejoint"):
                raise MJCFError(f"{self.path}: free joint {free.get('name')!r} on the chain to {site_name!r}")
        by_name = {joint.name: joint for joint in joints}
        if len(by_name) != len(joints) or set(by_name) != set(joint_names):
            raise MJCFError(
                f"{self.path}: the chain to site {site_name!r} has joints {[j.name for j in joints]}, "
                f"expected exactly {list(joint_names)}"
            )
        if [joint.name for joint in joints] != list(joint_names):
            raise MJCFError(
                f"{self.path}: the chain's joints {[j.name for j in joints]} are not in the spec's order "
                f"{list(joint_names)}"
            )
        return KinematicChain(
            joint_names,
            fixed=torch.stack(segments),
            axes=torch.tensor([j.axis for j in joints], dtype=torch.float64),
            anchors=torch.tensor([j.anchor for j in joints], dtype=torch.float64),
            refs=torch.tensor([j.ref for j in joints], dtype=torch.float64),
            slide=torch.tensor([j.kind == "slide" for j in joints]),
            site=fixed,
        )

    def _joint(self, element: ET.Element, class_name: str) -> _Joint:
        name = element.get("name")
        kind = self._attribute(element, "type", class_name) or "hinge"
        if kind not in ("hinge", "slide"):
            raise MJCFError(f"{self.path}: joint {name!r} is a {kind} joint; only hinge and slide are supported")
        axis = self._vector(element, "axis", class_name, 3, (0.0, 0.0, 1.0))
        norm = math.sqrt(sum(a * a for a in axis))
        if norm < 1e-12:
            raise MJCFError(f"{self.path}: joint {name!r} has a zero axis")
        ref = float(self._attribute(element, "ref", class_name) or 0.0)
        if kind == "hinge" and self.degrees:
            ref = math.radians(ref)
        return _Joint(
            name=name,
            kind=kind,
            axis=tuple(a / norm for a in axis),
            anchor=self._vector(element, "pos", class_name, 3, (0.0, 0.0, 0.0)),
            ref=ref,
        )

    def _vector(
        self, element: ET.Element, key: str, class_name: str, size: int, default: tuple[float, ...]
    ) -> tuple[float, ...]:
        text = self._attribute(element, key, class_name)
        if text is None:
            return default
        try:
            values = tuple(float(v) for v in text.split())
        except ValueError as error:
            raise MJCFError(f"{self.path}: <{element.tag} name={element.get('name')!r}> {key}={text!r}") from error
        if len(values) != size:
            raise MJCFError(
                f"{self.path}: <{element.tag} name={element.get('name')!r}> {key} needs {size} numbers, got {text!r}"
            )
        return values

    def _placement(self, element: ET.Element, class_name: str) -> torch.Tensor:
        transform = torch.eye(4, dtype=torch.float64)
        transform[:3, 3] = torch.tensor(self._vector(element, "pos", class_name, 3, (0.0, 0.0, 0.0)))
        transform[:3, :3] = self._orientation(element, class_name)
        return transform

    def _orientation(self, element: ET.Element, class_name: str) -> torch.Tensor:
        given = [k for k in ("quat", "axisangle", "euler", "xyaxes", "zaxis") if k in element.attrib]
        if len(given) > 1:
            raise MJCFError(f"{self.path}: <{element.tag} name={element.get('name')!r}> has both {given}")
        kind = given[0] if given else None
        if kind is None:  # a site's orientation may come from its class
            kind = next(
                (
                    k
                    for k in ("quat", "axisangle", "euler", "xyaxes", "zaxis")
                    if self._attribute(element, k, class_name)
                ),
                None,
            )
        if kind is None:
            return torch.eye(3, dtype=torch.float64)
        if kind == "quat":
            return _quat_to_matrix(self._vector(element, "quat", class_name, 4, (1.0, 0.0, 0.0, 0.0)))
        if kind == "axisangle":
            x, y, z, angle = self._vector(element, "axisangle", class_name, 4, (0.0, 0.0, 1.0, 0.0))
            return _axis_angle(torch.tensor([x, y, z], dtype=torch.float64), self._angle(angle))
        if kind == "euler":
            angles = self._vector(element, "euler", class_name, 3, (0.0, 0.0, 0.0))
            return self._euler(angles)
        if kind == "xyaxes":
            values = torch.tensor(self._vector(element, "xyaxes", class_name, 6, ()), dtype=torch.float64)
            x = values[:3] / values[:3].norm()
            y = values[3:] - (values[3:] @ x) * x
            y = y / y.norm()
            return torch.stack([x, y, torch.linalg.cross(x, y)], dim=1)
        z = torch.tensor(self._vector(element, "zaxis", class_name, 3, ()), dtype=torch.float64)
        z = z / z.norm()
        up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
        axis = torch.linalg.cross(up, z)
        if axis.norm() < 1e-12:
            return torch.eye(3, dtype=torch.float64) if z[2] > 0 else torch.diag(torch.tensor([1.0, -1.0, -1.0]))
        return _axis_angle(axis, math.atan2(axis.norm().item(), float(up @ z)))

    def _angle(self, value: float) -> float:
        return math.radians(value) if self.degrees else value

    def _euler(self, angles: tuple[float, ...]) -> torch.Tensor:
        if len(self.eulerseq) != 3 or any(c not in "xyzXYZ" for c in self.eulerseq):
            raise MJCFError(f"{self.path}: compiler eulerseq {self.eulerseq!r} is not three of xyzXYZ")
        rotation = torch.eye(3, dtype=torch.float64)
        for axis_name, angle in zip(self.eulerseq, angles, strict=True):
            axis = torch.zeros(3, dtype=torch.float64)
            axis["xyz".index(axis_name.lower())] = 1.0
            step = _axis_angle(axis, self._angle(angle))
            # lower case: rotations about the moving frame's axes; upper case: about the fixed frame's
            rotation = rotation @ step if axis_name.islower() else step @ rotation
        return rotation


def _quat_to_matrix(quat: tuple[float, ...]) -> torch.Tensor:
    w, x, y, z = (torch.tensor(quat, dtype=torch.float64) / math.sqrt(sum(v * v for v in quat))).tolist()
    return torch.tensor(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ],
        dtype=torch.float64,
    )


def _axis_angle(axis: torch.Tensor, angle: float) -> torch.Tensor:
    axis = axis / axis.norm()
    x, y, z = axis.tolist()
    cross = torch.tensor([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(angle) * cross + (1 - math.cos(angle)) * (cross @ cross)
