"""Checks of how the instance is exposed: ssh_password_login and exposed_ports."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from agents.checks.common import N_, PASS, SKIP, WARN, Text, joined, make
from agents.protocol import HealthCheck
from agents.system import ListeningSocket, SshdConfig

#: Ports that are fine on every interface.
ALLOWED_PORTS = frozenset({22})

#: Well-known ports of services that should not face the internet unprotected.
KNOWN_PORTS: Dict[int, str] = {
    3000: "Grafana/web UI",
    3306: "MySQL",
    5000: "Flask/MLflow",
    5432: "PostgreSQL",
    6006: "TensorBoard",
    6379: "Redis/Ray GCS",
    7860: "Gradio",
    8000: "HTTP server (vLLM, FastAPI)",
    8080: "HTTP server (code-server, web UI)",
    8265: "Ray dashboard",
    8501: "Streamlit",
    8787: "RStudio/Dask dashboard",
    8888: "Jupyter",
    8889: "Jupyter",
    9090: "Prometheus",
    11434: "Ollama",
    27017: "MongoDB",
    29500: "torch.distributed rendezvous",
}

#: Words in a listener's command line that name a service worth protecting.
KNOWN_COMMANDS: Tuple[Tuple[str, str], ...] = (
    ("jupyter", "Jupyter"),
    ("tensorboard", "TensorBoard"),
    ("gradio", "Gradio"),
    ("streamlit", "Streamlit"),
    ("code-server", "code-server"),
    ("mlflow", "MLflow"),
    ("vllm", "vLLM"),
    ("ollama", "Ollama"),
    ("http.server", "python http.server"),
    ("ray", "Ray"),
)

DEFAULT_SOURCE = "sshd's default"
_PASSWORD_METHODS = frozenset({"password", "keyboard-interactive"})


def check_ssh_password_login(config: SshdConfig) -> HealthCheck:
    """sshd refuses password logins (PasswordAuthentication, and keyboard-interactive through
    PAM; both default to yes). An AuthenticationMethods list without a password-only entry
    also passes."""
    if not config.found:
        return make(
            "ssh_password_login", SKIP, N_("no {path} (sshd not installed here?)", path=config.path)
        )
    enabled = password_login_settings(config)
    details = {
        "config": config.path,
        "files_read": list(config.files_read),
        "unreadable": list(config.unreadable),
        "settings": {k: config.get(k) for k in _RELEVANT},
        "password_login_via": [name for name, _ in enabled],
    }
    if enabled:
        where = joined("; ", [_setting_from(name, source) for name, source in enabled])
        files = sorted({source for _, source in enabled if source != DEFAULT_SOURCE})
        if files:
            hint = N_(
                "Password logins invite brute-force attacks. Set `PasswordAuthentication no` and "
                "`KbdInteractiveAuthentication no` in {target}; sshd keeps the first value it "
                "reads. Make sure your key works, then `sudo systemctl reload ssh`.",
                target=" and ".join(files),
            )
        else:
            hint = N_(
                "Password logins invite brute-force attacks. Set `PasswordAuthentication no` and "
                "`KbdInteractiveAuthentication no` in {path} (before any Match block); sshd keeps "
                "the first value it reads. Make sure your key works, then "
                "`sudo systemctl reload ssh`.",
                path=config.path,
            )
        return make(
            "ssh_password_login",
            WARN,
            N_("sshd accepts password logins: {where}", where=where),
            hint,
            details,
        )
    if config.unreadable:
        return make(
            "ssh_password_login",
            SKIP,
            N_("could not read {unreadable}", unreadable=", ".join(config.unreadable)),
            N_("Run the check as root to read every sshd configuration file."),
            details,
        )
    return make("ssh_password_login", PASS, N_("sshd accepts keys only"), "", details)


_RELEVANT = (
    "passwordauthentication",
    "kbdinteractiveauthentication",
    "usepam",
    "authenticationmethods",
)


def password_login_settings(config: SshdConfig) -> List[Tuple[str, str]]:
    """The settings that let a password alone log in: (what, where it was set)."""
    methods = config.get("authenticationmethods")
    if methods and methods.lower() != "any" and not _password_only_list(methods):
        return []
    found: List[Tuple[str, str]] = []
    if _yes(config.get("passwordauthentication"), default=True):
        found.append(("PasswordAuthentication yes", _source(config, "passwordauthentication")))
    if _yes(config.get("kbdinteractiveauthentication"), default=True) and _yes(
        config.get("usepam"), default=False
    ):
        found.append(
            (
                "KbdInteractiveAuthentication yes with UsePAM yes",
                _source(config, "kbdinteractiveauthentication"),
            )
        )
    return found


def _password_only_list(methods: str) -> bool:
    """Whether some AuthenticationMethods list needs nothing but passwords."""
    for method_list in methods.split():
        names = {m.split(":")[0].lower() for m in method_list.split(",") if m}
        if names and names <= _PASSWORD_METHODS:
            return True
    return False


def _yes(value: Optional[str], *, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() == "yes"


def _setting_from(setting: str, source: str) -> Text:
    """``setting`` and where it comes from: a file, or sshd's default."""
    if source == DEFAULT_SOURCE:
        return N_("{setting} (sshd's default)", setting=setting)
    return N_("{setting} ({file})", setting=setting, file=source)


def _source(config: SshdConfig, keyword: str) -> str:
    return config.sources.get(keyword, DEFAULT_SOURCE)


def check_exposed_ports(sockets: Sequence[ListeningSocket]) -> HealthCheck:
    """No well-known service (Jupyter, TensorBoard, Ray, Gradio ...) listens on all interfaces;
    port 22 is fine; other open ports are listed in the details."""
    exposed: Dict[int, ListeningSocket] = {}
    for sock in sockets:
        if sock.all_interfaces and sock.port not in ALLOWED_PORTS:
            known = exposed.get(sock.port)
            if known is None or (known.command is None and sock.command is not None):
                exposed[sock.port] = sock
    names = {port: service_name(sock) for port, sock in exposed.items()}
    risky = {port: name for port, name in names.items() if name is not None}
    details = {
        "all_interfaces": [
            {"port": p, "pid": s.pid, "command": s.command, "service": risky.get(p)}
            for p, s in sorted(exposed.items())
        ]
    }
    others = sorted(set(exposed) - set(risky))
    also = f" (also open: {', '.join(str(p) for p in others)})" if others else ""
    if risky:
        named = ", ".join(f"{name} on {port}" for port, name in sorted(risky.items()))
        first = min(risky)
        return make(
            "exposed_ports",
            WARN,
            N_("listening on all interfaces: {named}{also}", named=named, also=also),
            N_(
                "Anyone who can reach this machine can use them. Bind them to 127.0.0.1 (e.g. "
                "`jupyter lab --ip 127.0.0.1`) and open an SSH tunnel instead: `ssh -L "
                "{first}:localhost:{first} user@host`; or close the port in the provider's "
                "firewall.",
                first=first,
            ),
            details,
        )
    if others:
        return make(
            "exposed_ports", PASS, N_("no well-known service exposed{also}", also=also), "", details
        )
    return make("exposed_ports", PASS, N_("nothing but SSH listens on all interfaces"), "", details)


def service_name(sock: ListeningSocket) -> Optional[str]:
    """The service a listener looks like (by port, then by command line), or None."""
    if sock.port in KNOWN_PORTS:
        return KNOWN_PORTS[sock.port]
    command = (sock.command or "").lower()
    for word, name in KNOWN_COMMANDS:
        if _has_word(command, word):
            return name
    return None


def _has_word(command: str, word: str) -> bool:
    """Whether ``word`` appears in ``command`` as a whole path/argument component."""
    return re.search(r"(^|[\s/=])" + re.escape(word) + r"($|[\s:\-_.])", command) is not None
