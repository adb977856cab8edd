"""OpenAI's Responses API (``POST /v1/responses``), stateless, on the SDK like the rest of
the gateway: the request becomes one chat job (``request``, ``input_items``, ``tools``;
every field classified in ``fields``), its chunks become output items and events
(``output_items``, ``response_object``), and ``endpoint`` serves it."""

from kvrelay.gateway.responses_api.endpoint import ResponsesEndpoint

__all__ = ["ResponsesEndpoint"]
