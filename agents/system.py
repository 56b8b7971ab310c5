"""Facts about the machine the health checks judge: GPU device nodes, sshd settings, listeners,
disk space, /dev/shm and Xid errors in the kernel log.

Standard library only (Python 3.9+). Every reader takes its paths as arguments (defaults are
the real ones) so tests can point them at files they wrote. Readers never raise for a missing
or unreadable file: they report what they could not read.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple


@dataclass(frozen=True)
class SystemPaths:
    """Where the readers look; tests point these at a temporary directory."""

    dev_dir: str = "/dev"
    sshd_config: str = "/etc/ssh/sshd_config"
    proc_dir: str = "/proc"
    shm_dir: str = "/dev/shm"
    mounts: str = "/proc/self/mounts"
    kmsg: str = "/dev/kmsg"
    kernel_logs: Tuple[str, ...] = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
    #: (role, directory) pairs whose free space is checked; None: home, jobs and temp.
    disk_dirs: Optional[Tuple[Tuple[str, str], ...]] = None


# --- device nodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DevNode:
    """One device node: whether it exists and whether this user may read and write it."""

    path: str
    exists: bool
    usable: bool


@dataclass(frozen=True)
class DevNodeFacts:
    """The NVIDIA device nodes: ``control`` is /dev/nvidiactl, ``gpus`` /dev/nvidia0.., ``uvm``
    /dev/nvidia-uvm (CUDA's memory manager); ``dxg`` is /dev/dxg, WSL's GPU bridge."""

    control: DevNode
    gpus: Tuple[DevNode, ...]
    uvm: DevNode
    dxg: DevNode


def scan_dev_nodes(dev_dir: str = "/dev") -> DevNodeFacts:
    """Look for the NVIDIA device nodes under ``dev_dir``."""
    gpu_paths = sorted(
        (p for p in glob.glob(os.path.join(dev_dir, "nvidia[0-9]*")) if _is_gpu_node(p)),
        key=lambda p: int(os.path.basename(p)[len("nvidia") :]),
    )
    return DevNodeFacts(
        control=_dev_node(os.path.join(dev_dir, "nvidiactl")),
        gpus=tuple(_dev_node(p) for p in gpu_paths),
        uvm=_dev_node(os.path.join(dev_dir, "nvidia-uvm")),
        dxg=_dev_node(os.path.join(dev_dir, "dxg")),
    )


def _is_gpu_node(path: str) -> bool:
    return os.path.basename(path)[len("nvidia") :].isdigit()


def _dev_node(path: str) -> DevNode:
    exists = os.path.exists(path)
    return DevNode(path=path, exists=exists, usable=exists and os.access(path, os.R_OK | os.W_OK))


# --- sshd configuration -----------------------------------------------------------------------

#: Old spellings sshd still accepts, mapped to today's keyword (lower case).
_SSHD_ALIASES = {"challengeresponseauthentication": "kbdinteractiveauthentication"}
_MAX_INCLUDE_DEPTH = 16


@dataclass(frozen=True)
class SshdConfig:
    """sshd's global settings as sshd reads them: lower-case keyword -> first value seen.

    ``found`` is False when the main file does not exist (sshd is not installed or configured
    elsewhere). ``sources`` says which file set each keyword; ``unreadable`` lists files that
    exist but could not be read.
    """

    path: str
    found: bool
    settings: Dict[str, str] = field(default_factory=dict)
    sources: Dict[str, str] = field(default_factory=dict)
    files_read: Tuple[str, ...] = ()
    unreadable: Tuple[str, ...] = ()

    def get(self, keyword: str) -> Optional[str]:
        """The effective value of ``keyword`` (any case), or None when it is not set."""
        return self.settings.get(keyword.lower())


def read_sshd_config(path: str = "/etc/ssh/sshd_config") -> SshdConfig:
    """Parse sshd_config with its Include files; the first value of a keyword wins, as in sshd.

    Settings after the first ``Match`` line are conditional and are not global, so they are
    left out. Relative Include paths are taken from /etc/ssh, i.e. the main file's directory.
    """
    if not os.path.exists(path):
        return SshdConfig(path=path, found=False)
    state = _SshdParse(base_dir=os.path.dirname(path) or ".")
    state.read_file(path, depth=0)
    return SshdConfig(
        path=path,
        found=True,
        settings=state.settings,
        sources=state.sources,
        files_read=tuple(state.files_read),
        unreadable=tuple(state.unreadable),
    )


class _SshdParse:
    """Mutable state while reading one sshd configuration tree."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self.settings: Dict[str, str] = {}
        self.sources: Dict[str, str] = {}
        self.files_read: List[str] = []
        self.unreadable: List[str] = []
        self.in_match = False

    def read_file(self, path: str, depth: int) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            self.unreadable.append(path)
            return
        self.files_read.append(path)
        for line in lines:
            if self.in_match:
                return
            self._line(line, path, depth)

    def _line(self, line: str, path: str, depth: int) -> None:
        keyword, value = _split_directive(line)
        if not keyword:
            return
        if keyword == "match":
            self.in_match = True
            return
        if keyword == "include":
            self._include(value, depth)
            return
        keyword = _SSHD_ALIASES.get(keyword, keyword)
        if keyword not in self.settings:
            self.settings[keyword] = value
            self.sources[keyword] = path

    def _include(self, value: str, depth: int) -> None:
        if depth >= _MAX_INCLUDE_DEPTH:
            return
        for pattern in value.split():
            if not os.path.isabs(pattern):
                pattern = os.path.join(self.base_dir, pattern)
            for included in sorted(glob.glob(pattern)):
                if self.in_match:
                    return
                self.read_file(included, depth + 1)


def _split_directive(line: str) -> Tuple[str, str]:
    """``"PasswordAuthentication no"`` -> ("passwordauthentication", "no"); ("", "") for none."""
    text = line.strip()
    if not text or text.startswith("#"):
        return "", ""
    parts = re.split(r"[\s=]+", text, maxsplit=1)
    keyword = parts[0].lower()
    value = parts[1].strip().strip('"') if len(parts) > 1 else ""
    return keyword, value


# --- listening sockets ------------------------------------------------------------------------

_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class ListeningSocket:
    """A TCP socket in LISTEN state. ``address`` is printable ("0.0.0.0", "::", "127.0.0.1").

    ``command`` is the owning process's command line where it could be read (it needs the
    right to look into that process: the same user, or root).
    """

    family: str
    address: str
    port: int
    inode: int
    pid: Optional[int] = None
    command: Optional[str] = None

    @property
    def all_interfaces(self) -> bool:
        """True when bound to every interface (0.0.0.0 or ::)."""
        return self.address in ("0.0.0.0", "::")


def listening_sockets(proc_dir: str = "/proc", owners: bool = True) -> Tuple[ListeningSocket, ...]:
    """Every TCP listener from ``proc_dir``/net/tcp and tcp6, with owners when ``owners``."""
    found: List[ListeningSocket] = []
    for name, family in (("tcp", "ipv4"), ("tcp6", "ipv6")):
        try:
            with open(os.path.join(proc_dir, "net", name), encoding="ascii") as handle:
                text = handle.read()
        except OSError:
            continue
        found.extend(parse_proc_net_tcp(text, family))
    if owners:
        found = _with_owners(found, proc_dir)
    return tuple(found)


def parse_proc_net_tcp(text: str, family: str) -> List[ListeningSocket]:
    """The LISTEN rows of a /proc/net/tcp (``family`` "ipv4") or tcp6 ("ipv6") table."""
    sockets: List[ListeningSocket] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _TCP_LISTEN:
            continue
        try:
            address_hex, port_hex = cols[1].split(":")
            address = _decode_address(address_hex)
            port = int(port_hex, 16)
            inode = int(cols[9])
        except ValueError:
            continue
        sockets.append(ListeningSocket(family=family, address=address, port=port, inode=inode))
    return sockets


def _decode_address(hex_text: str) -> str:
    """Kernel hex (each 32-bit word in host byte order, little-endian here) to text."""
    if len(hex_text) == 8:
        raw = bytes.fromhex(hex_text)[::-1]
        return ".".join(str(b) for b in raw)
    if len(hex_text) == 32:
        words = [bytes.fromhex(hex_text[i : i + 8])[::-1] for i in range(0, 32, 8)]
        raw = b"".join(words)
        return _format_ipv6(raw)
    raise ValueError(f"bad address {hex_text!r}")


def _format_ipv6(raw: bytes) -> str:
    addr = ipaddress.IPv6Address(raw)
    mapped = addr.ipv4_mapped
    return str(mapped) if mapped is not None else str(addr)


def _with_owners(sockets: Iterable[ListeningSocket], proc_dir: str) -> List[ListeningSocket]:
    """Fill in pid and command for the sockets whose owner this user may look at."""
    result = list(sockets)
    wanted = {s.inode for s in result if s.inode}
    if not wanted:
        return result
    owners = _socket_owners(proc_dir, wanted)
    return [
        ListeningSocket(
            family=s.family,
            address=s.address,
            port=s.port,
            inode=s.inode,
            pid=owners[s.inode][0] if s.inode in owners else None,
            command=owners[s.inode][1] if s.inode in owners else None,
        )
        for s in result
    ]


def _socket_owners(proc_dir: str, inodes: Set[int]) -> Dict[int, Tuple[int, str]]:
    owners: Dict[int, Tuple[int, str]] = {}
    try:
        pids = [int(n) for n in os.listdir(proc_dir) if n.isdigit()]
    except OSError:
        return owners
    for pid in sorted(pids):
        fd_dir = os.path.join(proc_dir, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            match = re.match(r"socket:\[(\d+)\]$", target)
            if match and int(match.group(1)) in inodes and int(match.group(1)) not in owners:
                owners[int(match.group(1))] = (pid, _command_line(proc_dir, pid))
        if len(owners) == len(inodes):
            break
    return owners


def _command_line(proc_dir: str, pid: int) -> str:
    try:
        with open(os.path.join(proc_dir, str(pid), "cmdline"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return ""
    return " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)


# --- disk space -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilesystemFacts:
    """Space on the filesystem holding ``path``, shared by the ``roles`` that live on it.

    ``free_bytes`` is what an unprivileged user may still write (statvfs f_bavail);
    ``inodes_free`` likewise (f_favail; None where the filesystem has no inode limit).
    ``error`` says why nothing could be measured.
    """

    path: str
    roles: Tuple[str, ...]
    total_bytes: Optional[int]
    free_bytes: Optional[int]
    inodes_total: Optional[int]
    inodes_free: Optional[int]
    read_only: bool
    error: Optional[str] = None


def default_disk_dirs(environ: Optional[Dict[str, str]] = None) -> Tuple[Tuple[str, str], ...]:
    """The directories whose space matters: ("home", ~), ("jobs", GPU_AGENT_HOME, default
    ~/.gpu-agent, where job logs go) and ("temp", the temporary directory)."""
    import tempfile

    env = dict(os.environ) if environ is None else environ
    home = os.path.expanduser("~")
    jobs = env.get("GPU_AGENT_HOME") or os.path.join(home, ".gpu-agent")
    return (
        ("home", home),
        ("jobs", os.path.abspath(os.path.expanduser(jobs))),
        ("temp", tempfile.gettempdir()),
    )


def disk_facts(dirs: Iterable[Tuple[str, str]]) -> Tuple[FilesystemFacts, ...]:
    """One entry per filesystem among ``dirs`` ((role, directory) pairs), in first-seen order.

    A directory that does not exist yet is measured where it would be created (its nearest
    existing parent).
    """
    found: Dict[object, FilesystemFacts] = {}
    for role, path in dirs:
        where = _existing_parent(path)
        try:
            key: object = os.stat(where).st_dev
            vfs = os.statvfs(where)
        except OSError as exc:
            found[("error", path)] = FilesystemFacts(
                path, (role,), None, None, None, None, False, f"{where}: {exc.strerror or exc}"
            )
            continue
        if key in found:
            old = found[key]
            found[key] = FilesystemFacts(
                old.path,
                (*old.roles, role),
                old.total_bytes,
                old.free_bytes,
                old.inodes_total,
                old.inodes_free,
                old.read_only,
            )
            continue
        found[key] = FilesystemFacts(
            path=path,
            roles=(role,),
            total_bytes=vfs.f_blocks * vfs.f_frsize,
            free_bytes=vfs.f_bavail * vfs.f_frsize,
            inodes_total=vfs.f_files or None,
            inodes_free=vfs.f_favail if vfs.f_files else None,
            read_only=bool(vfs.f_flag & os.ST_RDONLY),
        )
    return tuple(found.values())


def _existing_parent(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


# --- /dev/shm ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShmFacts:
    """The shared-memory filesystem PyTorch's DataLoader workers pass batches through.

    ``fs_type`` is the type of the filesystem mounted exactly there ("tmpfs"), None when
    ``/dev/shm`` is a plain directory of a larger filesystem. ``error`` says why it could not
    be measured (``exists`` False: there is no /dev/shm).
    """

    path: str
    exists: bool
    total_bytes: Optional[int]
    free_bytes: Optional[int]
    fs_type: Optional[str]
    error: Optional[str] = None


def shm_facts(path: str = "/dev/shm", mounts: str = "/proc/self/mounts") -> ShmFacts:
    """Size and free space of ``path`` (statvfs) and what is mounted there."""
    if not os.path.isdir(path):
        return ShmFacts(path, False, None, None, None, f"{path} does not exist")
    fs_type = _mount_type(mounts, path)
    try:
        vfs = os.statvfs(path)
    except OSError as exc:
        return ShmFacts(path, True, None, None, fs_type, f"{path}: {exc.strerror or exc}")
    return ShmFacts(
        path=path,
        exists=True,
        total_bytes=vfs.f_blocks * vfs.f_frsize,
        free_bytes=vfs.f_bavail * vfs.f_frsize,
        fs_type=fs_type,
    )


def _mount_type(mounts: str, path: str) -> Optional[str]:
    """The type of the last filesystem mounted at ``path`` in a mounts table, or None."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    wanted = os.path.realpath(path)
    found = None
    for line in lines:
        cols = line.split()
        if len(cols) >= 3 and _unescape_mount(cols[1]) in (path, wanted):
            found = cols[2]
    return found


def _unescape_mount(text: str) -> str:
    """Mount points escape space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


# --- Xid errors in the kernel log -------------------------------------------------------------

#: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
_XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+),?\s*(.*)"
)
#: Bounds on what is read from the kernel log: records from /dev/kmsg, bytes from a file.
_KMSG_MAX_RECORDS = 50_000
_LOG_TAIL_BYTES = 4 * 2**20


@dataclass(frozen=True)
class KernelXid:
    """One Xid line of the kernel log: the GPU's PCI address as the kernel writes it
    ("0000:3b:00"), the Xid number, the rest of the line, and its age in seconds (None when
    the log does not say, as in a log file that may hold earlier boots)."""

    pci_bus_id: str
    xid: int
    message: str
    age_s: Optional[float]


@dataclass(frozen=True)
class KernelLogFacts:
    """Xid lines from the kernel log. ``source`` is what was read (None: nothing could be);
    ``unreadable`` lists what was tried and why it could not be read."""

    source: Optional[str]
    xids: Tuple[KernelXid, ...]
    unreadable: Tuple[str, ...] = ()

    @property
    def readable(self) -> bool:
        """Whether some kernel log could be read."""
        return self.source is not None


def kernel_xids(
    kmsg: str = "/dev/kmsg",
    log_files: Iterable[str] = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog"),
    uptime_path: str = "/proc/uptime",
) -> KernelLogFacts:
    """Xid errors since boot from ``kmsg`` (the kernel's ring buffer; it needs root, or
    kernel.dmesg_restrict=0), else from the first readable log file (read from its end)."""
    unreadable: List[str] = []
    try:
        records = _read_kmsg(kmsg)
    except OSError as exc:
        unreadable.append(f"{kmsg}: {exc.strerror or exc}")
    else:
        uptime = _uptime(uptime_path)
        return KernelLogFacts(kmsg, tuple(_kmsg_xids(records, uptime)), tuple(unreadable))
    for path in log_files:
        try:
            text = _tail_text(path, _LOG_TAIL_BYTES)
        except OSError as exc:
            if os.path.exists(path):
                unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        xids = [x for x in (_parse_xid(line, None) for line in text.splitlines()) if x]
        return KernelLogFacts(path, tuple(xids), tuple(unreadable))
    return KernelLogFacts(None, (), tuple(unreadable))


def _read_kmsg(path: str) -> List[str]:
    """Every record /dev/kmsg holds now (non-blocking reads, one record each); a regular file
    in its format reads the same. Raises OSError when it cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: List[bytes] = []
    try:
        for _ in range(_KMSG_MAX_RECORDS):
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # records overwritten while reading: go on with the next
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").splitlines()


def _kmsg_xids(records: Iterable[str], uptime: Optional[float]) -> List[KernelXid]:
    """Xid lines among kmsg records ("PRI,SEQ,MICROSECONDS,FLAGS;MESSAGE")."""
    found: List[KernelXid] = []
    for record in records:
        head, sep, message = record.partition(";")
        if not sep or record.startswith(" "):
            continue  # a continuation line (" KEY=value")
        parts = head.split(",")
        age: Optional[float] = None
        if len(parts) >= 3 and uptime is not None:
            try:
                age = max(0.0, round(uptime - int(parts[2]) / 1e6, 1))
            except ValueError:
                age = None
        xid = _parse_xid(message, age)
        if xid is not None:
            found.append(xid)
    return found


def _parse_xid(line: str, age: Optional[float]) -> Optional[KernelXid]:
    match = _XID_LINE.search(line)
    if match is None:
        return None
    return KernelXid(
        pci_bus_id=match.group(1).lower(),
        xid=int(match.group(2)),
        message=match.group(3).strip()[:300],
        age_s=age,
    )


def _tail_text(path: str, limit: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        return handle.read(limit).decode("utf-8", "replace")


def _uptime(path: str) -> Optional[float]:
    try:
        with open(path, encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
