"""A wake-up pipe: one I/O thread polls its read end, any thread writes to wake it.

Once closed, both ends are -1 and `wake()` does nothing: a closed descriptor's number may
already belong to another file, and a late watch callback must never write into it.
"""

from __future__ import annotations

import os


class WakePipe:
    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()  # `fd`: the end to poll
        os.set_blocking(self._write_fd, False)

    @property
    def closed(self) -> bool:
        return self._write_fd < 0

    def wake(self) -> None:
        """Wake the polling thread (any thread; a full pipe means it is awake already)."""
        fd = self._write_fd
        if fd < 0:
            return
        try:
            os.write(fd, b"x")
        except OSError:
            pass  # already awake (BlockingIOError), or closing

    def drain(self) -> None:
        """Consume the wake-ups so the next poll waits again (the polling thread)."""
        try:
            os.read(self.fd, 4096)
        except OSError:
            pass

    def close(self) -> None:
        fds, self.fd, self._write_fd = (self.fd, self._write_fd), -1, -1
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
