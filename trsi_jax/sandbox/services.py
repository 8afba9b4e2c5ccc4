"""Servers the agent leaves running, for tasks whose tests talk to them (docker backend).

Some Terminal-Bench tasks ask for a service (a git server over ssh, a web server, a mail service)
and test it over the network: the tests need the agent's servers running. The verifier never runs
beside the agent's processes, so on docker an agent container that holds a listening TCP socket
when the agent is done is kept instead of emptied: frozen (`docker pause`) while its files are
carried to the verifier's container, then thawed, and the verifier's container joins its network
namespace. Tests reach the servers on localhost as they would in harbor, yet the two containers
share no files and no processes: nothing in the agent's container can touch /tests,
/logs/verifier or the tests' processes. The agent's container (all of it: servers and anything
else still running) is removed with the sandbox.

Listeners are read from the host's view of the container's network namespace
(/proc/<init pid>/net/tcp*), never by running a program in the agent's container.
"""
from __future__ import annotations

from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening_ports(proc_net_tcp: str) -> set[int]:
    """Local ports in TCP LISTEN state in a /proc/net/tcp or tcp6 table."""
    ports = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == LISTEN:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def container_listeners(container, proc: Path = Path("/proc")) -> set[int]:
    """Ports a running docker container listens on (TCP, v4 and v6); empty when the engine's
    processes are not visible from here (a remote or rootless dockerd): then nothing is kept."""
    container.reload()
    pid = container.attrs.get("State", {}).get("Pid")
    ports: set[int] = set()
    for table in ("tcp", "tcp6") if pid else ():
        try:
            ports |= listening_ports((proc / str(pid) / "net" / table).read_text())
        except OSError:
            continue
    return ports
