"""The source layout installs: `pip install -e .` maps every room, operator/ included, and the
checkout never shadows the standard library's `operator`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def _mirror_without_leaseq(target: Path) -> Path:
    """This interpreter's site-packages, minus any installed leaseq, as a folder of links (so
    the editable install under test is the only leaseq its venv can import)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    target.mkdir()
    for entry in purelib.iterdir():
        if not entry.name.startswith(("leaseq", "__editable__", "__pycache__")):
            (target / entry.name).symlink_to(entry)
    return target


def test_editable_install_imports_every_room(tmp_path: Path) -> None:
    mirror = _mirror_without_leaseq(tmp_path / "site")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir, not a plain path line, so the mirror's own .pth files are processed too.
    Path(site, "_mirror.pth").write_text(f"import site; site.addsitedir({str(mirror)!r})\n")
    # Build isolation: the build gets the setuptools pyproject.toml asks for, as a user's would.
    install = [python, "-m", "pip", "install", "-q", "--no-deps"]
    done = subprocess.run(
        [*install, "-e", str(ROOT)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    check = (
        "import leaseq, leaseq.cli.main, leaseq.demo.run, leaseq.operator.app; "
        "print(leaseq.operator.app.__file__)"
    )
    done = subprocess.run([python, "-c", check], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(ROOT))  # the checkout itself, not a copy


@pytest.mark.parametrize("folder", [".", "worker"])
def test_the_checkout_never_shadows_the_standard_librarys_operator(folder: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.add(2, 3), operator.__file__)"],
        capture_output=True,
        text=True,
        cwd=ROOT / folder,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "5"
    assert not done.stdout.split()[1].startswith(str(ROOT))
