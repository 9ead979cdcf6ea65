"""Importing planlm sets OpenMP's wait policy before torch loads (threads sleep rather than spin while they wait for
work), unless the environment sets one."""

from __future__ import annotations

import os
import subprocess
import sys


def policy_after_import(environment_policy: str | None) -> str:
    env = {name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY"}
    if environment_policy:
        env["OMP_WAIT_POLICY"] = environment_policy
    code = "import os, planlm, torch; print(os.environ['OMP_WAIT_POLICY'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_planlm_sets_a_passive_wait_policy_unless_the_environment_has_one():
    assert policy_after_import(None) == "PASSIVE"
    assert policy_after_import("ACTIVE") == "ACTIVE"
