"""The source layout: a module's import path is its file's path under worker/, operator/ or
sql/ (a src/-style layout, no symlinks, no mapping to read in pyproject.toml); `pip install -e .`
imports every module from the checkout itself; and what only the operator needs comes with the
`operator` extra, so `import leaseq` and a worker run without kopf or the Kubernetes client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import leaseq
from support import net
from support.jobs import finished

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
# The design card's folders, each a root that holds one importable package.
SOURCE_ROOTS = ("worker", "operator", "sql")
# What only `leaseq operator` imports (the `operator` extra).
OPERATOR_ONLY = ("kopf", "kubernetes")


def _modules_by_path() -> dict[str, str]:
    """Every Python file under the source roots, keyed by the module name its path spells."""
    found: dict[str, str] = {}
    for root in SOURCE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = str(path)
    return found


def _mirror_site_packages(target: Path, *, without: tuple[str, ...] = ()) -> Path:
    """This interpreter's site-packages as a folder of links, minus any installed leaseq (so
    the install under test is the only one its venv sees) and minus the named distributions."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    target.mkdir()
    dropped = ("leaseq", "__editable__", "__pycache__", *without)
    for entry in purelib.iterdir():
        name = entry.name.lower().replace("-", "_")
        if not name.startswith(dropped):
            (target / entry.name).symlink_to(entry)
    return target


def _venv_with(tmp_path: Path, mirror: Path, *install: str) -> Path:
    """A venv without pip's packages of its own, with ``pip install --no-deps <install>``
    done in it, and then seeing ``mirror`` as its site-packages.

    The install comes first, by this interpreter's pip aimed at the venv (``--python``): pip's
    isolated build does not hide what a .pth file adds, so with the mirror in place the build
    ran on this interpreter's setuptools (and packaging) instead of the ``setuptools>=77``
    pyproject.toml asks for. A new Python 3.11 virtualenv has setuptools 65.5, which refuses
    the SPDX ``license = "Apache-2.0"`` ("project.license must be valid exactly by one
    definition"): in a fresh clone the README's test commands failed here."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    # Build isolation: the build gets the setuptools pyproject.toml asks for, as a user's would.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", *install],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir, not a plain path line, so the mirror's own .pth files are processed too.
    Path(site, "_mirror.pth").write_text(f"import site; site.addsitedir({str(mirror)!r})\n")
    return python


def test_no_symlinks_in_the_source_folders() -> None:
    links = [
        str(p.relative_to(ROOT)) for root in SOURCE_ROOTS for p in (ROOT / root).rglob("*")
        if p.is_symlink()
    ]  # fmt: skip
    assert links == []


def test_no_package_shadows_the_standard_library() -> None:
    tops = {name.split(".")[0] for name in _modules_by_path()}
    assert tops == {"leaseq", "leaseq_operator", "leaseq_sql"}
    assert not tops & set(sys.stdlib_module_names)


def test_editable_install_imports_every_module_from_the_file_its_path_names(
    tmp_path: Path,
) -> None:
    python = _venv_with(tmp_path, _mirror_site_packages(tmp_path / "site"), "-e", str(ROOT))
    modules = _modules_by_path()
    # find_spec, not import: the check is where each name resolves, for every module.
    check = (
        "import importlib.util, json, sys\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps({n: importlib.util.find_spec(n).origin for n in names}))\n"
    )
    done = subprocess.run(
        [python, "-c", check, json.dumps(sorted(modules))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == modules  # the checkout itself, every file where it says
    # The SQL is data: it must be readable through the package too, not only as files.
    done = subprocess.run(
        [python, "-c", "import leaseq.core.schema as s; print(len(s.known_migrations()))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(list((ROOT / "sql/leaseq_sql/migrations").glob("*.sql")))


@pytest.mark.parametrize("folder", [".", "worker", "operator", "sql"])
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


def test_without_the_operator_extra_a_worker_runs_and_the_operator_says_what_to_install(
    tmp_path: Path, database_url: str
) -> None:
    mirror = _mirror_site_packages(tmp_path / "site", without=OPERATOR_ONLY)
    python = _venv_with(tmp_path, mirror, str(ROOT))
    bin_dir = python.parent
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "LEASEQ_DATABASE_URL": database_url,
    }

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout
        )

    probe = run(str(python), "-c", "import importlib.util as u; print(u.find_spec('kopf'))")
    assert probe.stdout.strip() == "None", "the mirror still has kopf"
    done = run(str(python), "-c", "import leaseq, leaseq.runtime.worker, leaseq.cli.main")
    assert done.returncode == 0, done.stderr

    # The metadata says so too: the operator's libraries only under the extra.
    requires = run(
        str(python), "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('leaseq')))"
    ).stdout.splitlines()
    extras = {Requirement(line).name: str(Requirement(line).marker) for line in requires}
    for name in OPERATOR_ONLY:
        assert extras.get(name) == 'extra == "operator"', requires

    operator = run(str(bin_dir / "leaseq"), "operator", "--help")
    assert operator.returncode != 0
    assert "pip install 'leaseq[operator]'" in operator.stderr, operator.stderr
    assert "Traceback" not in operator.stderr

    # A worker without the extra claims and completes a job (apps.py: the process tests' app).
    pool = leaseq.open_pool(database_url)
    queue = leaseq.Queue(pool)
    try:
        job = queue.enqueue("nokube", "work", {"seconds": 0})
        worker = subprocess.Popen(
            [str(bin_dir / "leaseq"), "worker", "--app", "apps:registry", "--queue", "nokube",
             "--metrics-port", str(net.free_port())],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(Path(__file__).parent)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            record = finished(queue, job.job_id)
        finally:
            worker.terminate()
            output = worker.communicate(timeout=30)[0].decode()
        assert record.status is leaseq.JobStatus.SUCCEEDED, output
        assert worker.returncode == 0, output
    finally:
        pool.close()
