"""Containers that stand in for EC2 hosts: systemd as PID 1, on a private network.

The network is `internal`: the containers reach each other and this machine (the
test process dials their bridge addresses), never a package mirror or the internet.
`teardown()` removes every container and the network whatever state they are in;
`journals()` collects the RoQ units' logs for the report of a failing test.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

from tests.support.helpers import wait_until

log = logging.getLogger(__name__)

IMAGE = "roq-host:test"  # docker/build-host-image.sh
UNITS = ("roq-zookeeper", "roq-gcm", "roq-hcm", "roq-web")


class SystemdHosts:
    def __init__(self, client: Any, image: str = IMAGE) -> None:
        self.client = client
        self.image = image
        self.prefix = f"roq-deploy-{uuid.uuid4().hex[:8]}"
        self.labels = {"roq-test": self.prefix}
        self.containers: dict[str, Any] = {}
        self.ips: dict[str, str] = {}
        self.network = client.networks.create(f"{self.prefix}-net", driver="bridge", internal=True,
                                              labels=self.labels)

    def start(self, *names: str, boot_timeout: float = 60.0) -> None:
        for name in names:
            self._run(name)
        for name in names:
            wait_until(lambda n=name: self.system_state(n) == "running", timeout=boot_timeout,
                       message=f"systemd to boot {name} (failed units make it 'degraded')")

    def _run(self, name: str) -> None:
        # What systemd needs here (cgroup v1, Docker's default capabilities): its own /run and a
        # writable view of the cgroup hierarchies, where it makes its cgroups under the container's.
        container = self.client.containers.run(
            self.image, name=f"{self.prefix}-{name}", hostname=name, detach=True,
            network=self.network.name, labels=self.labels, cgroupns="host",
            tmpfs={"/run": "", "/run/lock": "", "/tmp": "exec,mode=1777"},
            volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
        )
        self.containers[name] = container
        container.reload()
        self.ips[name] = container.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]

    def container_name(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def system_state(self, name: str) -> str:
        return self.exec(name, "systemctl", "is-system-running", check=False)

    def exec(self, name: str, *command: str, check: bool = True) -> str:
        code, output = self.containers[name].exec_run(list(command))
        text = output.decode(errors="replace").strip()
        if check:
            assert code == 0, f"{' '.join(command)} on {name} exited {code}: {text}"
        return text

    def read(self, name: str, path: str) -> str:
        return self.exec(name, "cat", path)

    def fetch(self, name: str, path: str, into: Path) -> Path:
        """A copy of a host's file in `into`, for readers that want a path."""
        target = into / f"{name}-{Path(path).name}"
        target.write_text(self.read(name, path))
        return target

    def journals(self, lines: int = 80) -> str:
        parts = []
        for name in self.containers:
            units = [arg for unit in UNITS for arg in ("-u", unit)]
            try:
                text = self.exec(name, "journalctl", "--no-pager", "-n", str(lines), *units, check=False)
            except (NotFound, APIError) as exc:
                text = f"(no journal: {exc})"
            parts.append(f"----- {name} ({self.ips.get(name)}) -----\n{text}")
        return "\n".join(parts)

    def teardown(self) -> None:
        for container in self.client.containers.list(all=True, filters={"label": f"roq-test={self.prefix}"}):
            try:
                container.remove(force=True, v=True)
            except NotFound:
                pass
            except APIError as exc:
                log.warning("could not remove %s: %s", container.name, exc)
        try:
            self.network.remove()
        except NotFound:
            pass
        except APIError as exc:
            log.warning("could not remove network %s: %s", self.network.name, exc)
