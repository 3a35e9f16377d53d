"""The operator's calls to the Kubernetes API, through the synchronous ``kubernetes`` client.

Every method blocks: call them from kopf's sync handlers (which kopf runs in threads) or other
threads, never from a coroutine. Failures surface as :class:`KubeError` (with the HTTP status),
and a missing target as :class:`TargetNotFound`, so handlers never parse client exceptions.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

from leaseq.core.errors import ConfigError, LeaseqError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
#: The field manager of every write the operator makes: what ``kubectl get -o yaml
#: --show-managed-fields`` and a server-side apply conflict name as the owner of a field.
FIELD_MANAGER = "leaseq-operator"
#: Set (with ``spec.paused``) by the chart on a worker Deployment it creates: held at zero
#: pods until the operator's first scale, then removed by :meth:`Kube.resume`.
HELD_ANNOTATION = "leaseq.dev/paused-until-scaled"
#: In ``clusterWide`` mode a WorkerPool's Deployment must carry this label in
#: ``spec.selector.matchLabels`` (hence on its pods), valued with the pool's name. The selector
#: is the one part of a Deployment the admission policy sees on a scale subresource request
#: (the API server hands it a Scale object with no labels; see docs/guides/kubernetes.md).
POOL_LABEL = "leaseq.dev/worker-pool"
USER_AGENT = FIELD_MANAGER  # the API server takes the part before any "/" as the manager


class KubeError(LeaseqError):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0: no response)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class TargetNotFound(KubeError):
    """The object a WorkerPool names does not exist."""


MAX_SERVER_MESSAGE = 512  # characters of the API server's message kept in an error


def server_message(body: object) -> str | None:
    """The ``message`` of a Status object in an error response's body (what ``kubectl``
    prints: e.g. the admission policy that denied a patch), or None when the body is not one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str):
        return None
    try:
        status = json.loads(body)
    except ValueError:
        return None
    message = status.get("message") if isinstance(status, dict) else None
    if not isinstance(message, str) or not message.strip():
        return None
    message = " ".join(message.split())
    if len(message) > MAX_SERVER_MESSAGE:
        return f"{message[:MAX_SERVER_MESSAGE]}... ({len(message)} characters)"
    return message


@contextmanager
def _calling(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        kind = TargetNotFound if status == 404 else KubeError
        text = f"{what}: HTTP {status} {exc.reason or ''}".strip()
        message = server_message(exc.body)
        raise kind(f"{text}: {message}" if message else text, status) from exc
    except (OSError, ValueError) as exc:  # connection failures; unparseable responses
        raise KubeError(f"{what}: {exc}") from exc


def label_selector(selector: kubernetes.client.V1LabelSelector) -> str:
    """A Deployment's selector in the ``labelSelector`` query syntax (equality and set-based)."""
    terms = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for expr in selector.match_expressions or []:
        values = ",".join(expr.values or [])
        terms.append(
            {
                "In": f"{expr.key} in ({values})",
                "NotIn": f"{expr.key} notin ({values})",
                "Exists": expr.key,
                "DoesNotExist": f"!{expr.key}",
            }[expr.operator]
        )
    return ",".join(terms)


def _unschedulable(pod: kubernetes.client.V1Pod) -> str | None:
    """The scheduler's message if it found no node for the pod (PodScheduled=False, reason
    Unschedulable; reason and message are omitempty in the API, hence the defaults)."""
    for condition in (pod.status.conditions if pod.status else None) or []:
        if (condition.type, condition.status, condition.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return condition.message or "no node fits the pod"
    return None


@dataclass(frozen=True)
class Target:
    """A pool's Deployment, as far as scaling cares."""

    replicas: int
    #: The chart created it paused with :data:`HELD_ANNOTATION`: no pod until the operator
    #: scaled it and called :meth:`Kube.resume`.
    held: bool = False
    paused: bool = False
    #: The value of :data:`POOL_LABEL` in its ``spec.selector.matchLabels`` (None: absent).
    pool_label: str | None = None
    #: ``status.replicas``: its non-terminated pods (0 while the Deployment controller has
    #: written no status, as for a Deployment created paused, which has no ReplicaSet).
    pods: int = 0

    @property
    def unstarted(self) -> bool:
        """Held paused by the chart and without a pod: ``replicas`` (the API server's
        default of 1) never ran, so there is nothing to keep for a scale-down window. A
        rollback to the chart's first revision holds a Deployment whose pods run: not this."""
        return self.held and self.pods == 0


@dataclass(frozen=True)
class ObjectRef:
    """A custom object the operator writes status and Events for."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str
    name: str
    uid: str | None = None


@dataclass(frozen=True)
class Pod:
    """A pod of a Deployment, as far as scale-down protection cares."""

    name: str
    annotations: Mapping[str, str]
    terminating: bool
    #: The scheduler's message while the pod's PodScheduled condition is False for reason
    #: Unschedulable (no node fits: e.g. no GPU node); None otherwise.
    unschedulable: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Identified(kopf.ConnectionInfo):
    """kopf's connection, sending :data:`FIELD_MANAGER` as its user agent: kopf names no field
    manager on its own writes (removing the finalizer earlier versions added), and the API
    server then takes the user agent up to its first "/" instead (k8s.io/apiserver
    pkg/endpoints/handlers/create.go, ``managerOrUserAgent``, ``prefixFromUserAgent``)."""

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": USER_AGENT}


def _identified(login: Callable[..., kopf.ConnectionInfo | None]) -> Callable[..., Any]:
    def identified(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(**kwargs)
        if info is None:
            return None
        fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
        return _Identified(**fields)

    return identified


@dataclass(frozen=True)
class Cluster:
    """How to reach the API server: the sync client's configuration and kopf's login."""

    configuration: kubernetes.client.Configuration
    login: Callable[..., kopf.ConnectionInfo | None]

    @classmethod
    def from_environment(cls) -> Cluster:
        """In-cluster service account, else the current kubeconfig context (as kubectl does)."""
        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            try:
                kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
            except kubernetes.config.ConfigException as exc:
                raise ConfigError(
                    f"no Kubernetes credentials: not in a pod and no usable kubeconfig ({exc})"
                ) from exc
        return cls(
            kubernetes.client.Configuration.get_default_copy(), _identified(kopf.login_via_client)
        )

    @classmethod
    def at(cls, server: str) -> Cluster:
        """An API server at ``server`` that needs no credentials (tests, ``kubectl proxy``)."""

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=True)

        return cls(kubernetes.client.Configuration(host=server), _identified(login))


@dataclass
class Kube:
    """Typed calls on one shared API client (thread-safe: urllib3 pools its connections)."""

    cluster: Cluster
    _client: kubernetes.client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self._client = kubernetes.client.ApiClient(self.cluster.configuration)
        # Every write also names FIELD_MANAGER; a call that ever forgot would still not be
        # recorded as "OpenAPI-Generator" (the client's default user agent).
        self._client.user_agent = USER_AGENT
        self._apps = kubernetes.client.AppsV1Api(self._client)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def target(self, namespace: str, deployment: str) -> Target:
        """The Deployment's spec.replicas (1, the API server's default, when unset), whether
        the chart holds it paused for the operator's first scale, its pool label and pods."""
        with _calling(f"read deployment {namespace}/{deployment}"):
            found = self._apps.read_namespaced_deployment(deployment, namespace)
        spec = found.spec
        annotations = (found.metadata.annotations if found.metadata else None) or {}
        return Target(
            replicas=1 if spec is None or spec.replicas is None else int(spec.replicas),
            held=HELD_ANNOTATION in annotations,
            paused=bool(spec and spec.paused),
            pool_label=((spec.selector.match_labels or {}) if spec and spec.selector else {}).get(
                POOL_LABEL
            ),
            pods=int((found.status.replicas if found.status else None) or 0),
        )

    def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        """Set spec.replicas by a server-side apply of the scale subresource as
        :data:`FIELD_MANAGER`, forced: the operator becomes an *applier* owning the field (and
        nothing else of the Deployment), so an apply that leaves replicas out (helm, a GitOps
        sync, ``kubectl apply --server-side``) neither conflicts with it nor removes it."""
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": deployment, "namespace": namespace},
            "spec": {"replicas": replicas},
        }
        with _calling(f"scale deployment {namespace}/{deployment} to {replicas}"):
            self._apps.patch_namespaced_deployment_scale(
                deployment,
                namespace,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
            )

    def resume(self, namespace: str, deployment: str, paused: bool) -> None:
        """Let a Deployment the chart created paused roll out (after :meth:`scale` set its
        replicas): remove :data:`HELD_ANNOTATION` and, when ``paused``, ``spec.paused``.
        Removing (not setting false) leaves no manager owning either field, so rolling back to
        the chart revision that set them sets them again without a conflict."""
        key = HELD_ANNOTATION.replace("~", "~0").replace("/", "~1")
        patch: list[dict[str, Any]] = [
            {"op": "remove", "path": f"/metadata/annotations/{key}"},
        ]
        if paused:
            patch.append({"op": "remove", "path": "/spec/paused"})
        with _calling(f"resume deployment {namespace}/{deployment}"):
            self._apps.patch_namespaced_deployment(
                deployment,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=JSON_PATCH,
            )

    def pods(self, namespace: str, deployment: str) -> list[Pod]:
        """The pods the Deployment's selector matches (its current and older ReplicaSets')."""
        with _calling(f"read deployment {namespace}/{deployment}"):
            found = self._apps.read_namespaced_deployment(deployment, namespace)
        if found.spec is None or found.spec.selector is None:
            return []
        selector = label_selector(found.spec.selector)
        with _calling(f"list pods of deployment {namespace}/{deployment}"):
            listed = self._core.list_namespaced_pod(namespace, label_selector=selector)
        return [
            Pod(
                name=pod.metadata.name or "",
                annotations=dict(pod.metadata.annotations or {}),
                terminating=pod.metadata.deletion_timestamp is not None,
                unschedulable=_unschedulable(pod),
            )
            for pod in listed.items
            if pod.metadata is not None
        ]

    def annotate_pod(self, namespace: str, pod: str, annotations: Mapping[str, str]) -> None:
        with _calling(f"annotate pod {namespace}/{pod}"):
            self._core.patch_namespaced_pod(
                pod,
                namespace,
                {"metadata": {"annotations": dict(annotations)}},
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        """One key of a Secret, decoded."""
        with _calling(f"read secret {namespace}/{name}"):
            secret = self._core.read_namespaced_secret(name, namespace)
        encoded = (secret.data or {}).get(key)
        if encoded is None:
            raise TargetNotFound(f"secret {namespace}/{name} has no key {key!r}", 404)
        try:
            return base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise KubeError(f"secret {namespace}/{name} key {key!r} is not text: {exc}") from exc

    def patch_status(self, ref: ObjectRef, status: Mapping[str, Any]) -> None:
        """Merge ``status`` into the object's status subresource."""
        with _calling(f"write status of {ref.plural}/{ref.namespace}/{ref.name}"):
            self._custom.patch_namespaced_custom_object_status(
                ref.group,
                ref.version,
                ref.namespace,
                ref.plural,
                ref.name,
                {"status": dict(status)},
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )

    def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """An Event about the object, as ``kubectl describe`` shows them."""
        now = datetime.datetime.now(datetime.UTC)
        event = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(
                generate_name=f"{ref.name}.", namespace=ref.namespace
            ),
            involved_object=kubernetes.client.V1ObjectReference(
                api_version=f"{ref.group}/{ref.version}",
                kind=ref.kind,
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            source=kubernetes.client.V1EventSource(component=FIELD_MANAGER),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        with _calling(f"post event {reason} on {ref.plural}/{ref.namespace}/{ref.name}"):
            self._core.create_namespaced_event(ref.namespace, event, field_manager=FIELD_MANAGER)
