"""The connector example runs end to end (it is the documented integration point)."""

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "paged_kv_connector.py")


def test_paged_kv_connector_example(tmp_path):
    for store in ("mem://", f"file://{tmp_path}/store"):
        done = subprocess.run([sys.executable, EXAMPLE, "--store", store], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "loaded 256 of 300 tokens" in done.stdout, done.stdout
