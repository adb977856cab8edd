"""The OpenAI-compatible HTTP gateway: OpenAI API calls in, kvrelay jobs out (the SDK inside).

Installed with ``pip install "kvrelay[gateway]"``; nothing in the plain SDK imports it.
The gateway is stateless: a resumed stream is read back from the job's event log, so any
gateway process can serve it.
"""

from kvrelay.gateway.app import create_app
from kvrelay.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app"]
