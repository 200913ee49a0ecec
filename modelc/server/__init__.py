"""The HTTP server: Quart-trio handlers on Hypercorn that translate HTTP into engine messages.

* :mod:`~modelc.server.serve`       ``modelc run``: Hypercorn + the engine in one trio nursery
* :mod:`~modelc.server.app`         the app factory, request hooks, the one error handler
* :mod:`~modelc.server.schemas`     every request/response body (msgspec Structs with limits)
* :mod:`~modelc.server.errors`      exceptions -> HTTP status + OpenAI error object
* :mod:`~modelc.server.generation`  prompts, sampling and constraints -> GenerationRequest; events back
* :mod:`~modelc.server.tools`       tool offering, tool_choice constraints, tool-call parsing
* ``routes_openai`` / ``routes_native`` / ``routes_ollama``  the endpoints
* :mod:`~modelc.server.sse`, :mod:`~modelc.server.auth`, :mod:`~modelc.server.metrics`,
  :mod:`~modelc.server.logging`, :mod:`~modelc.server.openapi`, ``static/chat.html``
"""
