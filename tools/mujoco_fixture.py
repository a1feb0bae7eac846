#!/usr/bin/env python3
"""Writes tests/fixtures/mujoco/rollouts.json: the shipped MuJoCo models stepped by the
`mujoco` Python package under fixed action sequences.

The reference for `shardes_mujoco` and `shardes::mjcf`. Run it once, in a
throw-away virtualenv outside the repository, and commit what it writes:

    python3 -m venv /tmp/mjvenv
    /tmp/mjvenv/bin/pip install mujoco==4.0.0
    /tmp/mjvenv/bin/python tools/mujoco_fixture.py tests/fixtures/mujoco/rollouts.json

For each model (examples/mujoco/cartpole.xml and reacher.xml) it loads the file with
`MjModel.from_xml_path`, resets, sets qpos = qpos0 + `qpos_offset` and qvel = `qvel`, then
for t = 0..T-1 writes ctrl = `ctrl[t]` (in the actuators' [-1, 1] range, from the formula
below, rounded to float32) and calls `mj_step` once, recording qpos and qvel after every step. Floats are
written with Python's repr, which reads back to the same double.

`tests/suite/mujoco_fixture.rs` replays the same steps through shardes' bindings and compares.
"""

import json
import math
import sys
from pathlib import Path

import mujoco
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
STEPS = 200
CASES = [
    # name, model, qpos offset, qvel
    ("cartpole", "examples/mujoco/cartpole.xml", [0.01, -0.03], [0.02, 0.05]),
    ("reacher", "examples/mujoco/reacher.xml", [0.3, -0.5, 0.1, -0.15], [0.01, -0.02, 0.0, 0.0]),
]


def ctrl(t, nu):
    """A fixed, non-trivial action sequence in [-1, 1], rounded to float32 (the policy's
    actions are f32, so the environment's path sees exactly these controls)."""
    return [float(np.float32(max(-1.0, min(1.0, 0.9 * math.sin(0.07 * (t + 1) * (i + 1))
                                                + 0.3 * math.cos(0.31 * t)))))
            for i in range(nu)]


def rollout(path, qpos_offset, qvel):
    m = mujoco.MjModel.from_xml_path(str(ROOT / path))
    d = mujoco.MjData(m)
    mujoco.mj_resetData(m, d)
    d.qpos[:] = [a + b for a, b in zip(m.qpos0, qpos_offset)]
    d.qvel[:] = qvel
    out = {"model": path, "qpos_offset": qpos_offset, "qvel0": qvel,
           "ctrl": [], "qpos": [], "qvel": []}
    for t in range(STEPS):
        u = ctrl(t, m.nu)
        d.ctrl[:] = u
        mujoco.mj_step(m, d)
        out["ctrl"].append(u)
        out["qpos"].append([float(x) for x in d.qpos])
        out["qvel"].append([float(x) for x in d.qvel])
    return out


def main():
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/mujoco/rollouts.json"
    fixture = {"mujoco": mujoco.__version__, "library": mujoco.mj_versionString(), "steps": STEPS,
               "cases": {name: rollout(p, q, v) for name, p, q, v in CASES}}
    target.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
