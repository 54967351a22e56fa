"""Ballast host agent: connects a host's machine to the coordinator and runs jobs.

The agent is a standalone program (``python -m agent run ...``). It imports nothing
from Django or from the coordinator's apps; it speaks the websocket protocol
``ballast.host.v1`` described in ``PROTOCOL.md`` section 2.
"""

__version__ = "0.1.0"
