"""The coordinator's websockets on the job side: the renter's chat socket
(``renter``) and the job relay on a machine's socket (``host``)."""

from .host import HostRelayConsumer
from .renter import RenterChatConsumer

__all__ = ["HostRelayConsumer", "RenterChatConsumer"]
