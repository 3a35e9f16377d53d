"""kmock's KubernetesEmulator with the real API server behaviours the operator relies on.

kmock 0.8 stores objects as plain JSON and merges every write. The subclass below restores
what kopf and the operator need from a real API server; each patch says which behaviour it
restores (the gaps were found running kopf 1.45 against kmock 0.8). It does not
validate objects against schemas (tests validate WorkerPools against the CRD separately),
run controllers, or implement PUT, strategic-merge semantics or watch bookmarks.

:class:`EmulatorServer` runs it on a loopback port in a thread of its own with its own event
loop, so the operator (in another thread) and the synchronous test code can both call it.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import re
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock import action

ObjectKey = tuple[kmock.resource, str | None, str]
CRD_PATH = Path(__file__).parents[2] / "charts" / "leaseq" / "crds" / "workerpools.leaseq.dev.yaml"
SELECTOR_TERM = re.compile(r"^\s*(!)?\s*([\w./-]+)\s*(?:(==|=|!=)\s*([\w.-]*))?\s*$")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels_match(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        found = SELECTOR_TERM.match(term)
        if found is None:
            raise kmock.KubernetesError(400, "BadRequest", f"unsupported selector {term!r}")
        negated, key, op, value = found.groups()
        if op is None:
            if (key in labels) == bool(negated):
                return False
        elif (labels.get(key) == value) != (op != "!="):
            return False
    return True


def _fields_match(selector: str, obj: Mapping[str, Any]) -> bool:
    """Field selectors on metadata.name / metadata.namespace (what clients commonly use)."""
    meta = obj.get("metadata", {})
    for term in filter(None, (t.strip() for t in selector.split(","))):
        path, op, value = re.split(r"(!=|==|=)", term, maxsplit=1)
        actual = meta.get(path.removeprefix("metadata."))
        if (actual == value) != (op != "!="):
            return False
    return True


@attrs.frozen
class Write:
    """One write request as the API server received it."""

    method: str
    path: str
    params: dict[str, str]
    content_type: str
    user_agent: str
    body: Any


class LeaseqEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus the API server behaviours listed on each method."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Real servers keep one resourceVersion counter for everything (etcd's revision).
        self.revision = 0
        # plural -> the admission denial every write to such an object gets (deny_updates).
        self.denied_updates: dict[str, str] = {}
        # Every write request (POST, PATCH, PUT, DELETE) in arrival order, for tests that
        # check who wrote what (the fieldManager query parameter) and which fields.
        self.writes: list[Write] = []

    def deny_updates(self, plural: str, policy: str, message: str) -> None:
        """Make every PATCH of a ``plural`` object (not its subresources) fail as a
        ValidatingAdmissionPolicy denial does: HTTP 422 with a Status body (see
        :meth:`_denied`)."""
        binding = policy  # the chart names the binding after its policy
        self.denied_updates[plural] = (
            f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request:"
            f" {message}"
        )

    # -- helpers -----------------------------------------------------------------------------

    def _next_revision(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _subresources(self, resource: kmock.resource) -> set[str]:
        return set(self.resources[resource].subresources) if resource in self.resources else set()

    def _current(self, key: ObjectKey) -> dict[str, Any]:
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return copy.deepcopy(self.objects[key].raw)

    async def _store(self, key: ObjectKey, body: dict[str, Any], event: str) -> None:
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body
        await self._buses[key[0]].put({"type": event, "object": copy.deepcopy(body)})

    def _key(self, request: kmock.Request, name: str | None = None) -> ObjectKey:
        assert request.resource is not None
        return (request.resource, request.namespace, name or request.name or "")

    @staticmethod
    def _apply(body: dict[str, Any], patch: Any) -> dict[str, Any]:
        """Merge patch (a mapping; null deletes) or JSON patch (a list of operations)."""
        if isinstance(patch, list):
            try:
                return dict(jsonpatch.apply_patch(body, patch, in_place=False))
            # Restores: a failed JSON-patch `test` op (kopf's optimistic concurrency on
            # resourceVersion when it adds finalizers) is HTTP 422, not 500.
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                raise kmock.KubernetesError(422, "Invalid", str(exc)) from exc
        obj = kmock.Object(body)
        obj.patch(patch or {})
        return obj.raw

    # -- the request dispatcher ----------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        method = str(getattr(request.method, "value", request.method)).upper()
        if method in {"POST", "PATCH", "PUT", "DELETE"}:
            self.writes.append(
                Write(
                    method=method,
                    path=request.url.path,
                    params=dict(request.params),
                    content_type=request.headers.get("Content-Type", "").split(";")[0],
                    user_agent=request.headers.get("User-Agent", ""),
                    body=copy.deepcopy(request.data),
                )
            )
        if request.resource is None or request.resource.plural is None or request.action is None:
            return await super()._handle(request)  # discovery, non-API paths, PUT
        async with self._lock:
            if request.subresource == "scale":
                return self._json(await self._scale(request))
            if request.subresource == "status":
                return self._json(await self._status(request))
            if request.action == action.CREATE:
                return self._json(await self._create(request), status=201)
            if request.action == action.UPDATE:
                return self._json(await self._update(request))
            if request.action == action.DELETE and request.name:
                return self._json(await self._delete(request))
            if request.action == action.LIST:
                return self._json(self._list(request))
            if request.action == action.FETCH:
                return self._json(self._current(self._key(request)))
        return await super()._handle(request)  # watches stream outside the lock

    async def _serve_server_version(self, request: Any) -> Any:
        """A version the chart supports (its Chart.yaml kubeVersion): kmock says 1.26."""
        served = await super()._serve_server_version(request)
        return {**served, "major": "1", "minor": "31", "gitVersion": "v1.31.0"}

    async def _serve_version(self, request: Any) -> Any:
        """Restores: the core group's APIResourceList says ``groupVersion: v1`` (kmock writes
        ``/v1``, and kubectl's and helm's REST mappers then find no core kind at all: kubectl took
        ``pods`` for metrics.k8s.io's)."""
        served = await super()._serve_version(request)
        if isinstance(served, dict) and str(served.get("groupVersion", "")).startswith("/"):
            served = {**served, "groupVersion": served["groupVersion"][1:]}
        return served

    @staticmethod
    def _json(payload: Any, status: int = 200) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(payload, status=status)

    # -- writes ------------------------------------------------------------------------------------

    async def _create(self, request: kmock.Request) -> dict[str, Any]:
        body = copy.deepcopy(request.data)
        meta = body.setdefault("metadata", {})
        # Restores: metadata.generateName gets a random suffix (kopf names its Events so).
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise kmock.KubernetesError(422, "Invalid", "metadata.name: Required value")
        # Restores: the namespace from the URL is written into the object's metadata.
        if request.namespace:
            meta["namespace"] = request.namespace
        key = self._key(request, meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(409, "AlreadyExists", f"{meta['name']} already exists")
        # Restores: uid, resourceVersion, generation and creationTimestamp on every object
        # (kopf's finalizer JSON-patch tests resourceVersion; Events refer to the uid).
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_revision(),
            generation=1,
            creationTimestamp=_now(),
        )
        await self._store(key, body, "ADDED")
        return body

    def _denied(self, key: ObjectKey) -> kmock.KubernetesError | None:
        """A policy denial as the API server sends it: a ``Status`` (k8s.io/apimachinery
        pkg/apis/meta/v1/types.go: ``message``, ``reason``, ``details`` and ``code`` are
        omitempty fields, all set here; kmock renders ``kind``, ``apiVersion``, ``metadata: {}``
        and ``status: Failure``), reason Invalid and code 422 (the policy plugin's default
        reason), ``details`` naming the object, the message prefixed by
        ``<plural> "<name>" is forbidden:`` as the server's Forbidden errors are."""
        denial = self.denied_updates.get(str(key[0].plural))
        if denial is None:
            return None
        return kmock.KubernetesError(
            422,
            "Invalid",
            f'{key[0].plural} "{key[2]}" is forbidden: {denial}',
            {"name": key[2], "kind": key[0].plural},
        )

    async def _update(self, request: kmock.Request) -> dict[str, Any]:
        key = self._key(request)
        before = self._current(key)
        denied = self._denied(key)
        if denied is not None:
            raise denied
        patch = request.data
        # Restores: with a status subresource, writes to the object ignore .status.
        if "status" in self._subresources(key[0]) and isinstance(patch, Mapping):
            patch = {k: v for k, v in patch.items() if k != "status"}
        after = self._apply(before, patch)
        if "status" in self._subresources(key[0]):
            after["status"] = before.get("status")
            if after["status"] is None:
                del after["status"]
        return await self._commit(key, before, after)

    async def _commit(
        self, key: ObjectKey, before: dict[str, Any], after: dict[str, Any]
    ) -> dict[str, Any]:
        meta = after.setdefault("metadata", {})
        # Restores: every change bumps resourceVersion; spec changes bump generation.
        meta["resourceVersion"] = self._next_revision()
        if after.get("spec") != before.get("spec"):
            meta["generation"] = int(before.get("metadata", {}).get("generation", 1)) + 1
        # Restores: an object marked for deletion goes once its last finalizer is removed.
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects[key].create(after)
            self.objects[key].delete()
            await self._buses[key[0]].put({"type": "DELETED", "object": copy.deepcopy(after)})
            return after
        await self._store(key, after, "MODIFIED")
        return after

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        key = self._key(request)
        before = self._current(key)
        meta = before.get("metadata", {})
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return before
            after = copy.deepcopy(before)
            after["metadata"]["deletionTimestamp"] = _now()
            return await self._commit(key, before, after)
        self.objects[key].delete()
        await self._buses[key[0]].put({"type": "DELETED", "object": before})
        return before

    # -- subresources ---------------------------------------------------------------------------

    async def _status(self, request: kmock.Request) -> dict[str, Any]:
        """Restores: /status reads the object and writes only its .status."""
        key = self._key(request)
        before = self._current(key)
        if request.action != action.UPDATE:
            return before
        patched = self._apply(before, request.data)
        after = copy.deepcopy(before)
        after["status"] = patched.get("status", {})
        return await self._commit(key, before, after)

    async def _scale(self, request: kmock.Request) -> dict[str, Any]:
        """Restores: /scale is a Scale object (autoscaling/v1), and writing it changes only the
        Deployment's spec.replicas (kmock merged the Scale into the Deployment itself)."""
        key = self._key(request)
        before = self._current(key)
        scale = self._render_scale(before)
        if request.action != action.UPDATE:
            return scale
        replicas = self._apply(scale, request.data).get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise kmock.KubernetesError(422, "Invalid", f"spec.replicas: invalid {replicas!r}")
        after = copy.deepcopy(before)
        after.setdefault("spec", {})["replicas"] = replicas
        return self._render_scale(await self._commit(key, before, after))

    @staticmethod
    def _render_scale(deployment: Mapping[str, Any]) -> dict[str, Any]:
        meta = deployment.get("metadata", {})
        labels = deployment.get("spec", {}).get("selector", {}).get("matchLabels", {})
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": deployment.get("spec", {}).get("replicas", 1)},
            "status": {
                "replicas": deployment.get("status", {}).get("replicas", 0),
                "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            },
        }

    # -- reads ------------------------------------------------------------------------------------

    def _selected(self, request: kmock.Request, obj: Mapping[str, Any]) -> bool:
        """Restores: labelSelector and fieldSelector filter lists and watches."""
        labels = obj.get("metadata", {}).get("labels") or {}
        by_label = request.params.get("labelSelector")
        by_field = request.params.get("fieldSelector")
        return (not by_label or _labels_match(by_label, labels)) and (
            not by_field or _fields_match(by_field, obj)
        )

    def _visible(self, request: kmock.Request) -> list[dict[str, Any]]:
        found = []
        for (resource, namespace, _), obj in self.objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if self._selected(request, obj.raw):
                found.append(copy.deepcopy(obj.raw))
        return found

    def _list(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        if resource is None or resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        kind = self.resources[resource].kind if resource in self.resources else None
        # Restores: a list says what it is (kubectl refuses one without a kind) and carries the
        # revision it was read at, for the watch that follows.
        return {
            "apiVersion": "/".join(filter(None, (resource.group, resource.version))),
            "kind": f"{kind or resource.plural.capitalize()}List",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": self._visible(request),
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""
        since = request.params.get("resourceVersion")
        async with self._lock:
            events = [
                {"type": "ADDED", "object": obj}
                for obj in self._visible(request)
                # Restores: a watch from a resourceVersion sends only what changed after it
                # (kmock replayed every object as ADDED, so kopf handled them twice).
                if not since
                or not since.isdigit()
                or int(obj["metadata"].get("resourceVersion", 0)) > int(since)
            ]
        for event in events:
            yield event
        assert request.resource is not None
        async for event in self._buses[request.resource]:
            obj = event.get("object", {})
            namespace = obj.get("metadata", {}).get("namespace")
            if request.namespace is not None and namespace != request.namespace:
                continue
            if self._selected(request, obj):
                yield event


@attrs.define
class EmulatorServer:
    """The emulator served on 127.0.0.1 from a thread with its own event loop."""

    emulator: LeaseqEmulator = attrs.field(factory=LeaseqEmulator)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None

    def __enter__(self) -> EmulatorServer:
        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._stop = asyncio.Event()
            try:
                async with self.emulator, kmock.Server(self.emulator) as server:
                    self.url = str(server.url).rstrip("/")
                    started.set()
                    await self._stop.wait()
            except BaseException as exc:
                failure.append(exc)
                started.set()
                raise

        def thread() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(serve())
            self._loop.close()

        self._thread = threading.Thread(target=thread, name="kmock-emulator", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            raise failure[0]
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)


def leaseq_server(crd: Mapping[str, Any]) -> EmulatorServer:
    """An emulator (not started yet) serving the built-in resources and ``crd`` (WorkerPool)."""
    server = EmulatorServer()
    with warnings.catch_warnings():  # kmock reads its bundle with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        server.emulator.resources.load_bundled()
    [version] = crd["spec"]["versions"]
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    server.emulator.resources[f"{group}/{version['name']}/{plural}"] = kmock.ResourceInfo(
        kind=crd["spec"]["names"]["kind"],
        singular=crd["spec"]["names"]["singular"],
        namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources=set(version["subresources"]),
    )
    return server
