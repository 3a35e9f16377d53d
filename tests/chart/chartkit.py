"""Run helm (and friends) on the chart and give the rendered objects back as dicts.

Tools are looked up on PATH, then in <repo>/.tools/bin (where scripts/fetch-tools.sh puts
them); a missing tool skips the test that needs it, with the command that installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "leaseq"
CRD_PATH = Path("crds") / "workerpools.leaseq.dev.yaml"
CRD_STAND_IN = Path(__file__).with_name("fixtures") / "workerpools.leaseq.dev.yaml"
TOOLS_BIN = REPO / ".tools" / "bin"
FETCH_HINT = "run scripts/setup-tests.sh (README: Running the tests)"
MONITORING_API = "monitoring.coreos.com/v1"

Obj = dict[str, Any]


def tool(name: str) -> str:
    """Path of a command-line tool (PATH, this interpreter's bin/, .tools/bin), or skip the
    calling test saying how to get it."""
    search = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    found = shutil.which(name, path=search) or shutil.which(name, path=str(TOOLS_BIN))
    if found is None:
        pytest.skip(f"{name} not found on PATH or in {TOOLS_BIN}: {FETCH_HINT}")
    return found


def run(
    args: Sequence[str], *, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; on failure with check, fail with its stderr."""
    proc = subprocess.run(
        list(args), capture_output=True, text=True, timeout=600, check=False, env=env
    )
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def chart_copy(dest: Path) -> tuple[Path, bool]:
    """A copy of the chart to render. Returns (chart dir, whether the real CRD is in it).

    The WorkerPool CRD is written by the operator work; until it exists in this tree, the copy
    gets the stand-in from tests/chart/fixtures so everything else can still be rendered.
    """
    chart = dest / "leaseq"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("__pycache__"))
    real = (CHART / CRD_PATH).is_file()
    if not real:
        shutil.copy(CRD_STAND_IN, chart / CRD_PATH)
    return chart, real


def values_files() -> list[Path | None]:
    """None (the chart's defaults) and every ci/*-values.yaml example."""
    return [None, *sorted((CHART / "ci").glob("*-values.yaml"))]


def values_id(path: Path | None) -> str:
    """Short test id for a values file."""
    return "default" if path is None else path.name.removesuffix("-values.yaml")


class Helm:
    """helm bound to one chart directory."""

    def __init__(self, binary: str, chart: Path) -> None:
        self.binary = binary
        self.chart = chart

    def args(
        self,
        values: Path | None = None,
        sets: dict[str, str] | None = None,
        api_versions: Sequence[str] = (),
        kube_version: str | None = None,
    ) -> list[str]:
        out = []
        if values is not None:
            out += ["-f", str(values)]
        for key, value in (sets or {}).items():
            out += ["--set", f"{key}={value}"]
        for api in api_versions:
            out += ["--api-versions", api]
        if kube_version:
            out += ["--kube-version", kube_version]
        return out

    def lint(self, values: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run([self.binary, "lint", "--strict", str(self.chart), *self.args(values)])

    def template_raw(
        self,
        values: Path | None = None,
        sets: dict[str, str] | None = None,
        api_versions: Sequence[str] = (),
        kube_version: str | None = None,
        *,
        include_crds: bool = False,
        check: bool = True,
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, "template", "rel", str(self.chart), "--namespace", "jobs", *extra]
        if include_crds:
            cmd.append("--include-crds")
        return run(cmd + self.args(values, sets, api_versions, kube_version), check=check)

    def render(
        self,
        values: Path | None = None,
        sets: dict[str, str] | None = None,
        api_versions: Sequence[str] = (),
        kube_version: str | None = None,
        *,
        include_crds: bool = False,
        extra: Sequence[str] = (),
    ) -> list[Obj]:
        """helm template, parsed: every non-empty document (``extra``: more helm flags)."""
        out = self.template_raw(
            values, sets, api_versions, kube_version, include_crds=include_crds, extra=extra
        ).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, component: str | None = None) -> Obj:
    """The single object of a kind (and app.kubernetes.io/component)."""
    found = [
        o
        for o in of_kind(objs, kind)
        if component is None
        or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
    return found[0]


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(object, pod spec) for every Deployment, Job and Pod."""
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield o, o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o, o["spec"]


def selectors(objs: list[Obj]) -> Iterator[tuple[str, dict[str, str]]]:
    """Every label selector the chart renders, named by where it is."""
    for o in objs:
        name = f"{o['kind']}/{o['metadata']['name']}"
        spec = o.get("spec") or {}
        if o["kind"] == "Service":
            yield name, spec.get("selector", {})
        elif isinstance(spec.get("selector"), dict):
            yield name, spec["selector"].get("matchLabels", {})
        if o["kind"] == "Deployment":
            affinity = spec["template"]["spec"].get("affinity", {})
            for term in affinity.get("podAntiAffinity", {}).get(
                "preferredDuringSchedulingIgnoredDuringExecution", []
            ):
                yield (
                    f"{name} anti-affinity",
                    term["podAffinityTerm"]["labelSelector"]["matchLabels"],
                )


def env_names(container: Obj) -> list[str]:
    return [e["name"] for e in container.get("env", [])]


def env_with(binary: str) -> dict[str, str]:
    """The environment with `binary`'s folder first on PATH (checkov runs helm from PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(binary).parent), env.get("PATH", "")])
    return env
