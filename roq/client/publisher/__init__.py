"""The publishing side of the client: `Publisher` (api), its I/O thread and link to one exchange
(exchange_link, exchange_socket, exchange_choice, batches), its message log (chunks) and the
checks of what it accepts (checks)."""

from roq.client.publisher.api import Publisher
from roq.client.stats import PublisherStats

__all__ = ["Publisher", "PublisherStats"]
