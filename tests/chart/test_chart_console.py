"""The chart's web console (issue 25): off by default; when on, a Deployment and Service (and
an Ingress when asked) locked down like every workload, never without authentication, its
own database Secret, and the migration granting its role."""

from __future__ import annotations

import pytest
from chartkit import Helm, Obj, of_kind, one

ON = {
    "console.enabled": "true",
    "console.basicAuth.existingSecret": "console-users",
    "database.console.existingSecret": "leaseq-db-console",
}


def _console(objs: list[Obj]) -> Obj:
    return one(objs, "Deployment", "console")


def _env(container: Obj) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_off_by_default(helm: Helm) -> None:
    objs = helm.render()
    labels = [o["metadata"].get("labels", {}).get("app.kubernetes.io/component") for o in objs]
    assert "console" not in labels
    migrate = one(objs, "Job", "migrate")["spec"]["template"]["spec"]["containers"][0]
    assert "LEASEQ_CONSOLE_ROLE" not in _env(migrate)


def test_deployment_and_service(helm: Helm) -> None:
    objs = helm.render(sets=ON)
    spec = _console(objs)["spec"]["template"]["spec"]
    worker = one(objs, "Deployment", "worker")["spec"]["template"]["spec"]
    assert spec["securityContext"] == worker["securityContext"]
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["args"] == ["console"]
    assert c["securityContext"] == worker["containers"][0]["securityContext"]
    env = _env(c)
    assert env["LEASEQ_CONSOLE_AUTH"] == "basic"
    assert env["LEASEQ_CONSOLE_ADDRESS"] == "0.0.0.0"
    assert env["LEASEQ_CONSOLE_BASIC_AUTH_FILE"] == "/etc/leaseq-console/users"
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    (users,) = [v for v in spec["volumes"] if v["name"] == "users"]
    assert users["secret"]["secretName"] == "console-users"
    service = one(objs, "Service", "console")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert not of_kind(objs, "Ingress")


def test_never_without_authentication(helm: Helm) -> None:
    out = helm.template_raw(sets={"console.enabled": "true"}, check=False)
    assert out.returncode != 0 and "basicAuth.existingSecret" in out.stderr
    out = helm.template_raw(sets={"console.enabled": "true", "console.auth": "proxy"}, check=False)
    assert out.returncode != 0 and "trustedProxies" in out.stderr
    out = helm.template_raw(sets={**ON, "console.auth": "none"}, check=False)
    assert out.returncode != 0  # the schema allows basic and proxy only


def test_proxy_mode(helm: Helm) -> None:
    sets = {
        **ON,
        "console.auth": "proxy",
        "console.trustedProxies[0]": "10.0.0.0/8",
        "console.proxyHeader": "X-Auth-Request-User",
    }
    c = _console(helm.render(sets=sets))["spec"]["template"]["spec"]["containers"][0]
    env = _env(c)
    assert env["LEASEQ_CONSOLE_TRUSTED_PROXY"] == "10.0.0.0/8"
    assert env["LEASEQ_CONSOLE_PROXY_HEADER"] == "X-Auth-Request-User"
    assert "LEASEQ_CONSOLE_BASIC_AUTH_FILE" not in env


def test_trusted_proxies_with_basic_auth(helm: Helm) -> None:
    """Behind an Ingress, basic sign-ins are throttled per client only when the console is told
    the controller's addresses; by default it believes no X-Forwarded-For."""
    c = _console(helm.render(sets=ON))["spec"]["template"]["spec"]["containers"][0]
    assert "LEASEQ_CONSOLE_TRUSTED_PROXY" not in _env(c)
    sets = {**ON, "console.trustedProxies": "{10.42.0.0/16,fd00:42::/56}"}
    c = _console(helm.render(sets=sets))["spec"]["template"]["spec"]["containers"][0]
    assert _env(c)["LEASEQ_CONSOLE_TRUSTED_PROXY"] == "10.42.0.0/16,fd00:42::/56"
    assert _env(c)["LEASEQ_CONSOLE_BASIC_AUTH_FILE"] == "/etc/leaseq-console/users"
    out = helm.template_raw(sets={**ON, "console.trustedProxies[0]": ""}, check=False)
    assert out.returncode != 0  # the schema refuses an empty entry


def test_ingress(helm: Helm) -> None:
    sets = {
        **ON,
        "console.ingress.enabled": "true",
        "console.ingress.host": "leaseq.example.com",
        "console.ingress.tlsSecret": "tls",
    }
    ingress = one(helm.render(sets=sets), "Ingress", "console")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "leaseq.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "rel-leaseq-console"
    assert ingress["spec"]["tls"] == [{"hosts": ["leaseq.example.com"], "secretName": "tls"}]


def test_the_csrf_cookie_is_secure_behind_tls(helm: Helm) -> None:
    """Behind the Ingress's TLS (or another TLS proxy, console.behindHttps) the console sees
    plain http, so the chart tells it its cookie must be Secure."""
    c = _console(helm.render(sets=ON))["spec"]["template"]["spec"]["containers"][0]
    assert "LEASEQ_CONSOLE_BEHIND_HTTPS" not in _env(c)
    tls = {**ON, "console.ingress.enabled": "true", "console.ingress.tlsSecret": "tls"}
    for sets in (tls, {**ON, "console.behindHttps": "true"}):
        c = _console(helm.render(sets=sets))["spec"]["template"]["spec"]["containers"][0]
        assert _env(c)["LEASEQ_CONSOLE_BEHIND_HTTPS"] == "true"


@pytest.mark.parametrize("admin", ["true", "false"])
def test_the_migration_grants_the_console_role(helm: Helm, admin: str) -> None:
    sets = {**ON, "database.roles.console": "leaseq_console", "console.admin": admin}
    objs = helm.render(sets=sets)
    migrate = one(objs, "Job", "migrate")["spec"]["template"]["spec"]["containers"][0]
    env = _env(migrate)
    assert env["LEASEQ_CONSOLE_ROLE"] == "leaseq_console"
    assert env["LEASEQ_CONSOLE_ADMIN"] == admin


def test_its_own_database_secret(helm: Helm) -> None:
    sets = {**ON, "database.existingSecret": "shared", "database.console.existingSecret": "c"}
    c = _console(helm.render(sets=sets))["spec"]["template"]["spec"]["containers"][0]
    (url,) = [e for e in c["env"] if e["name"] == "LEASEQ_DATABASE_URL"]
    assert url["valueFrom"]["secretKeyRef"]["name"] == "c"


def test_never_the_shared_owner_url(helm: Helm) -> None:
    """Without a Secret of its own the console would get the shared URL, the tables' owner:
    the chart refuses to render, saying what to set."""
    sets = {k: v for k, v in ON.items() if k != "database.console.existingSecret"}
    for shared in ({"database.existingSecret": "shared"}, {"database.url": "postgresql://o@db/a"}):
        out = helm.template_raw(sets={**sets, **shared}, check=False)
        assert out.returncode != 0, shared
        assert "database.console.existingSecret" in out.stderr and "owner" in out.stderr


def test_the_demo_postgresql_gives_the_console_a_role_of_its_own(helm: Helm) -> None:
    sets = {k: v for k, v in ON.items() if k != "database.console.existingSecret"}
    objs = helm.render(sets={**sets, "postgresql.enabled": "true"})
    c = _console(objs)["spec"]["template"]["spec"]["containers"][0]
    (url,) = [e for e in c["env"] if e["name"] == "LEASEQ_DATABASE_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "rel-leaseq-database", "key": "console-url"}
    secret = one(objs, "Secret", "database")["stringData"]
    assert secret["console-url"].startswith("postgresql://leaseq_console:")
    assert secret["console-role.sql"].startswith("CREATE ROLE leaseq_console LOGIN")
    migrate = one(objs, "Job", "migrate")["spec"]["template"]["spec"]["containers"][0]
    assert _env(migrate)["LEASEQ_CONSOLE_ROLE"] == "leaseq_console"
    pg = one(objs, "Deployment", "postgresql")["spec"]["template"]["spec"]
    (init,) = [v for v in pg["volumes"] if v["name"] == "init"]
    assert init["secret"]["items"] == [{"key": "console-role.sql", "path": "console-role.sql"}]
    worker = one(objs, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]
    (shared,) = [e for e in worker["env"] if e["name"] == "LEASEQ_DATABASE_URL"]
    assert shared["valueFrom"]["secretKeyRef"]["key"] == "url"


def test_the_console_env_is_what_leaseq_console_reads(helm: Helm) -> None:
    """The rendered env goes through the real settings code and comes out as set."""
    from test_chart_env import environ

    from leaseq.cli.main import build_parser
    from leaseq.console.settings import ConsoleSettings

    sets = {**ON, "console.statementTimeout": "3s", "console.allowedOrigins[0]": "https://a.b"}
    c = _console(helm.render(sets=sets))["spec"]["template"]["spec"]["containers"][0]
    env = environ(c)
    env["LEASEQ_CONSOLE_BASIC_AUTH_FILE"] = "/etc/leaseq-console/users"
    config = ConsoleSettings.from_args(build_parser().parse_args(["console"]), env)
    assert config.auth == "basic" and config.address == "0.0.0.0" and config.port == 8089
    assert config.statement_timeout == 3.0 and config.allowed_origin == ("https://a.b",)


def test_no_api_token_unless_it_reads_worker_pools(helm: Helm) -> None:
    objs = helm.render(sets=ON)
    spec = _console(objs)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert not [o for o in of_kind(objs, "Role") if o["metadata"]["name"] == "rel-leaseq-console"]
    objs = helm.render(sets={**ON, "console.readWorkerPools": "true"})
    spec = _console(objs)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == "rel-leaseq-console"
    (role,) = [o for o in of_kind(objs, "Role") if o["metadata"]["name"] == "rel-leaseq-console"]
    assert role["rules"] == [
        {"apiGroups": ["leaseq.dev"], "resources": ["workerpools"], "verbs": ["get", "list"]}
    ]
    (binding,) = [
        o for o in of_kind(objs, "RoleBinding") if o["metadata"]["name"] == "rel-leaseq-console"
    ]
    assert binding["subjects"][0]["name"] == "rel-leaseq-console"
    env = _env(spec["containers"][0])
    assert env["LEASEQ_CONSOLE_POOLS_NAMESPACE"] == "jobs"


def _selects(policy: Obj, labels: dict[str, str]) -> bool:
    """A NetworkPolicy's podSelector (matchLabels, matchExpressions with In) matches labels."""
    selector = policy["spec"]["podSelector"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_a_network_policy_selects_the_console_and_opens_only_its_port(helm: Helm) -> None:
    """Issue 48: the console's pods were selected by no NetworkPolicy (open on every port)."""
    objs = helm.render(sets={**ON, "console.port": "8090"})
    labels = _console(objs)["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in of_kind(objs, "NetworkPolicy") if _selects(p, labels)]
    assert policies, "no NetworkPolicy selects the console's pods"
    ports = {
        (port["port"], port["protocol"])
        for policy in policies
        for rule in policy["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert ports == {(8090, "TCP")}
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
    key = "networkPolicy.consoleFrom[0].namespaceSelector.matchLabels"
    objs = helm.render(sets={**ON, f"{key}.kubernetes\\.io/metadata\\.name": "ingress"})
    (rule,) = [
        r
        for p in of_kind(objs, "NetworkPolicy")
        if _selects(p, labels)
        for r in p["spec"]["ingress"]
    ]
    assert rule["from"] == [peer]
