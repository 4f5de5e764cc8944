"""The ego vehicle: a kinematic bicycle driven by a normalised [longitudinal, steering] action.

The state is kept in the road frame (s along the road, d to the left of the right road edge).
Heading is stored as a unit vector (cos_h, sin_h) and rotated with a Cayley (rational) rotation,
so one step uses only +, -, *, / and sqrt. Those are correctly rounded in IEEE 754, which makes
a slot's trajectory bitwise identical whichever batch (and SIMD lane) computes it; transcendental
ufuncs (sin, cos, arctan2) carry no such guarantee across numpy's vector and scalar loops.
"""

from __future__ import annotations

import math

import numpy as np

DT = 0.1  # s per step
EGO_LENGTH = 4.6  # m
EGO_WIDTH = 1.9  # m
WHEELBASE = 2.8  # m
ACCEL_MIN = -6.0  # m/s^2 at longitudinal action -1
ACCEL_MAX = 3.0  # m/s^2 at longitudinal action +0.5 and above
ACCEL_PER_UNIT = -ACCEL_MIN  # m/s^2 per unit of longitudinal action, both ways
MAX_STEER_RAD = 0.5  # front-wheel angle at steering action +-1, at low speed
LAT_ACCEL_MAX = 4.0  # m/s^2: above ~sqrt(LAT_ACCEL_MAX / KAPPA_GEOMETRIC) m/s, steering is limited by grip
SPEED_MAX = 45.0  # m/s
KAPPA_GEOMETRIC = math.tan(MAX_STEER_RAD) / WHEELBASE  # 1/m, the tightest turn the steering allows


def accel_command(longitudinal: np.ndarray) -> np.ndarray:
    """Action in [-1, 1] -> commanded acceleration: 6 m/s^2 per unit both ways, capped at +3.

    One slope through 0 (0 holds the speed), not 3 per unit forward and 6 braking: with a kink at
    0, a Gaussian policy's noise brakes on average (-3 sigma * 0.4 m/s^2 at mean 0), the policy
    learns a higher mean to make up for it, and its deterministic mean action, played in
    evaluation, then drives faster than the policy ever trained to (docs/learning.md).
    """
    return np.minimum(longitudinal * ACCEL_PER_UNIT, ACCEL_MAX)


def max_curvature(speed: np.ndarray) -> np.ndarray:
    """Largest |curvature| (1/m) at `speed`: the steering lock, or the lateral-acceleration limit."""
    return np.minimum(KAPPA_GEOMETRIC, LAT_ACCEL_MAX / np.maximum(speed * speed, 1e-6))


def step_ego(
    s: np.ndarray,
    d: np.ndarray,
    cos_h: np.ndarray,
    sin_h: np.ndarray,
    speed: np.ndarray,
    actions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One DT step for k egos; actions [k, 2]. Returns (s, d, cos_h, sin_h, speed, realised accel).

    Rear-axle kinematic bicycle with the steering action read as a curvature command
    kappa = steer * max_curvature(v) (equivalent to a wheel angle atan(kappa * WHEELBASE)).
    Speed is clamped to [0, SPEED_MAX]: the ego never reverses, so the realised acceleration
    (what comfort terms and metrics see) is the speed change over DT, not the command.
    """
    actions = actions.astype(np.float64)
    new_speed = np.minimum(np.maximum(speed + accel_command(actions[:, 0]) * DT, 0.0), SPEED_MAX)
    accel = (new_speed - speed) / DT
    mean_speed = 0.5 * (speed + new_speed)
    kappa = actions[:, 1] * max_curvature(mean_speed)
    # Cayley rotation by the yaw increment dpsi: exactly a rotation by 2*atan(dpsi/2) ~ dpsi - dpsi^3/12.
    half = 0.5 * mean_speed * kappa * DT
    denom = 1.0 + half * half
    rot_c = (1.0 - half * half) / denom
    rot_s = 2.0 * half / denom
    new_cos = cos_h * rot_c - sin_h * rot_s
    new_sin = sin_h * rot_c + cos_h * rot_s
    norm = np.sqrt(new_cos * new_cos + new_sin * new_sin)  # keeps rounding drift off the unit circle
    new_cos, new_sin = new_cos / norm, new_sin / norm
    # Trapezoidal position update along the mean of the old and new heading.
    travel = mean_speed * DT
    new_s = s + travel * 0.5 * (cos_h + new_cos)
    new_d = d + travel * 0.5 * (sin_h + new_sin)
    return new_s, new_d, new_cos, new_sin, new_speed, accel
